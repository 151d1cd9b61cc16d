"""Fixtures every test gets: the fit cache lives in this session's temporary folder, never in ~/.cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def fit_cache_in_a_temp_dir(tmp_path_factory):
    """One cache for the session (refits are slow; sharing them between tests is what a cache is for),
    set in the environment so CLI runs in subprocesses inherit it."""
    before = os.environ.get("FTPLAN_CACHE_DIR")
    os.environ["FTPLAN_CACHE_DIR"] = str(tmp_path_factory.mktemp("fit-cache"))
    yield
    if before is None:
        del os.environ["FTPLAN_CACHE_DIR"]
    else:
        os.environ["FTPLAN_CACHE_DIR"] = before
