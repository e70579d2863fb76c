"""Shared test setup: small thread counts so the suite behaves the same on 2-core machines."""

import logging
import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _restore_nmt_logger():
    """CLIs run in-process (CliRunner) install their own handlers on the 'nmt' logger and stop
    propagation; undo that so later tests' caplog sees records again."""
    logger = logging.getLogger("nmt")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    yield
    logger.handlers[:] = handlers
    logger.propagate = propagate
    logger.setLevel(level)
