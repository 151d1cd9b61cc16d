"""The calibration record store (JSONL files of trials) and the content-keyed cache of fits made from them."""
