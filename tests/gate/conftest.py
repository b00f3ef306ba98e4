"""Fixtures for the gate tests; the harness lives in gate_harness.py, the real Slurm lab in tests/slurmlab.py."""

from __future__ import annotations

import pytest
from gate_harness import Slurm


@pytest.fixture
def slurm(tmp_path):
    return Slurm(tmp_path)


@pytest.fixture(scope="session")
def slurmlab(tmp_path_factory):
    """One real Slurm cluster (munged, slurmctld, slurmd; one node) for the session, torn down leak-free."""
    from tests.slurmlab import SlurmLab, need_lab

    need_lab()
    lab = SlurmLab(tmp_path_factory.mktemp("slurmlab"))
    lab.start()
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture
def node(slurmlab):
    """The lab's node back in service (IDLE, no reason, no reservation, no job) before and after the test."""
    slurmlab.reset()
    yield slurmlab
    slurmlab.reset()
