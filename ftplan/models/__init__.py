"""Fits and the analytic prior: turn calibration records into predictions. Never imports torch."""
