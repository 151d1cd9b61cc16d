"""Shared facts every stage agrees on: the Setting, errors, units, the record contract, architectures,
the GPU catalog and where data lives. Imports nothing from calibration, models or planner."""
