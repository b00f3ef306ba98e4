"""The Slurm lab leaves nothing behind when it cannot start: daemons gone, network namespace deleted."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.procs import alive


def test_a_lab_that_fails_to_start_leaves_nothing(tmp_path):
    from tests.slurmlab import SlurmLab, need_lab

    need_lab()

    lab = SlurmLab(tmp_path)
    lab._extra["SelectType"] = "select/no_such_plugin"  # slurmctld exits at start: munged is already running
    started = {}
    real_daemon = lab._daemon

    def record(name, argv, ns=None):
        real_daemon(name, argv, ns)
        started[name] = lab.procs[name].pid

    lab._daemon = record
    with pytest.raises(RuntimeError, match="slurmctld exited"):
        lab.start()
    assert set(started) == {"munged", "slurmctld"}
    assert not any(alive(pid) for pid in started.values())
    assert not Path(f"/run/netns/{lab.netns}").exists() and lab.leftovers() == []
    assert not lab.pub.exists()  # the readable conf and socket directory too
