"""Real, short profiling fine-tunes that produce calibration records.

Importing this package must not import torch: the planner reads records through ftplan.store.records.
"""
