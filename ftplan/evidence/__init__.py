"""What a prediction rests on: the calibration records and links read once, the catalog card, the fitted predictor
(the Workspace that `predict`, `plan`, `eta`, the Python API and the Trainer callback all open)."""
