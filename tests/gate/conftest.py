"""Fixtures for the gate tests; the harness lives in gate_harness.py."""

from __future__ import annotations

import pytest
from gate_harness import Slurm


@pytest.fixture
def slurm(tmp_path):
    return Slurm(tmp_path)
