"""Fixtures for the gate tests; the harness lives in gate_harness.py, the real Slurm lab in tests/slurmlab.py."""

from __future__ import annotations

import os

import pytest
from gate_harness import Slurm

from tests import needs


@pytest.fixture
def slurm(tmp_path):
    return Slurm(tmp_path)


@pytest.fixture(scope="session")
def slurmlab(tmp_path_factory):
    """One real Slurm cluster (munged, slurmctld, slurmd; one node) for the session, torn down leak-free."""
    for name in ("munged", "slurmctld", "slurmd", "scontrol", "ip", "nsenter"):
        needs.need(name)
    if os.geteuid() != 0:
        needs.unavailable("the Slurm lab needs root (a network namespace; munged, slurmctld, slurmd as root)")
    from tests.slurmlab import SlurmLab

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
