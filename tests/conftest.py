"""Fixtures shared by the test files: the fit cache in this session's temporary folder (every test), one torch
thread for the tiny-model training tests, and the fake calibration trial."""

from __future__ import annotations

import json
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


@pytest.fixture
def one_torch_thread(monkeypatch):
    """Tiny models on a shared 2-core machine run several times faster on one thread than on two: in this process
    and in the trials and ranks it starts (OMP_NUM_THREADS; two 2-thread ranks on 2 cores, or a 2-thread trial
    beside another job, spin-wait for each other: a real tiny CPU calibration took 62 s on two threads, 26 s on
    one). It also skips the tests that use it where transformers is missing: they import torch and transformers
    inside, so collecting the suite loads neither. Files of training tests use it for every test (pytestmark)."""
    pytest.importorskip("transformers")
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fake_trial(monkeypatch):
    """Trials run the fake; the returned function sets its behaviour (see tests/fixtures/fake_trial.py)."""
    return lambda **behaviour: monkeypatch.setenv("FAKE_TRIAL", json.dumps(behaviour))
