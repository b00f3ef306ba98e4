"""`model stage --apply` killed with SIGKILL at random points never leaves DST looking complete when it is not."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from gpudoctor.model import probe
from gpudoctor.model import stage as st
from .modelfiles import shard_name, write_model

RUNS = 24
THROTTLE = {"GPUDOCTOR_TEST_STAGE_DELAY_S": "0.02", "GPUDOCTOR_TEST_STAGE_CHUNK": "4096"}


def stage_cmd(src, dst):
    return [sys.executable, "-m", "gpudoctor", "model", "stage", "--from", str(src), "--to", str(dst), "--apply",
            "--jobs", "2"]


def visible_files(dst):
    out = {}
    for root, dirs, files in os.walk(dst):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), dst)
            if f.endswith(probe.PART_SUFFIX) or rel in (probe.MARKER_NAME, probe.LOCK_NAME):
                continue
            out[rel] = open(os.path.join(root, f), "rb").read()
    return out


def assert_never_falsely_complete(dst, source: dict, before: dict | None = None, fresh: bool = True):
    """Every file under its real name is whole (or untouched damage the test made before the run); verify never
    says complete when it is not; a marker only ever vouches for the truth."""
    got = visible_files(dst) if os.path.isdir(dst) else {}
    before = before or {}
    for name, data in got.items():
        assert data == source[name] or data == before.get(name), \
            f"{name} is visible but not whole ({len(data)} of {len(source[name])} bytes)"
    rep = probe.verify_model(str(dst)) if os.path.isdir(dst) else {"complete": False}
    if rep["complete"]:
        assert got == source, f"verify says complete but {sorted(set(source) - set(got))} are missing"
    if fresh and os.path.exists(os.path.join(dst, probe.MARKER_NAME)):  # (the test damages DST under a marker)
        assert rep["complete"] and got == source, "a marker vouches for an incomplete directory"
    return rep["complete"]


def copy_started(dst, proc, within: float = 120.0) -> float:
    """When the stage process began writing DST (a .part file appeared), or ended without one; monotonic time."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if any(n.endswith(probe.PART_SUFFIX) for n in os.listdir(dst)):
                break
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    return time.monotonic()


@pytest.mark.timeout(900)  # 25 interpreter starts: slow only on an overloaded machine
def test_sigkill_at_random_points(tmp_path, shm_dir, state_dir):
    src = tmp_path / "m"
    source = write_model(src, shards=4, tensors_per_shard=2, elems=8192)
    env = dict(os.environ, **THROTTLE)
    rng = random.Random(int(os.environ.get("GPUDOCTOR_TEST_SEED", "4")))

    # The kill is timed from the moment copying starts (the first .part file), not from the process start: on a
    # loaded machine interpreter start-up varies by seconds, and kills timed from it land before any copying.
    full = subprocess.Popen(stage_cmd(src, shm_dir), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    copying = copy_started(shm_dir, full)
    assert full.wait(timeout=120) == 0, full.stderr.read()
    t_copy = time.monotonic() - copying
    assert assert_never_falsely_complete(shm_dir, source)

    outcomes = {"complete": 0, "incomplete": 0, "parts": 0}
    for i in range(RUNS):
        # start from a fresh DST, or from what the previous rerun left with some shards damaged
        if i % 3 == 0:
            subprocess.run(["rm", "-rf", str(shm_dir)], check=True)
        else:
            for k in rng.sample(range(1, 5), rng.randint(1, 3)):
                p = shm_dir / shard_name(k, 4)
                if rng.random() < 0.5:
                    os.unlink(p)
                else:
                    with open(p, "r+b") as fh:
                        fh.truncate(rng.randint(0, os.path.getsize(p) - 1))
        before = visible_files(shm_dir) if shm_dir.is_dir() else {}
        proc = subprocess.Popen(stage_cmd(src, shm_dir), env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        copy_started(shm_dir, proc)
        # within the first 60 % of the copy as the unloaded full run timed it: a loaded machine only copies slower,
        # so the kill still lands mid-copy, at a random point
        time.sleep(rng.uniform(0.0, 0.6 * t_copy))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=300)
        if shm_dir.is_dir() and any(n.endswith(probe.PART_SUFFIX) for n in os.listdir(shm_dir)):
            outcomes["parts"] += 1
        complete = assert_never_falsely_complete(shm_dir, source, before, fresh=i % 3 == 0)
        outcomes["complete" if complete else "incomplete"] += 1
        res = st.apply_stage(st.plan_stage(str(src), str(shm_dir)), jobs=2)  # the rerun (in-process: fast)
        assert res["verify"]["complete"]
        assert assert_never_falsely_complete(shm_dir, source)
        assert visible_files(shm_dir) == source
        assert not [n for n in os.listdir(shm_dir) if n.endswith(probe.PART_SUFFIX)]
    print(outcomes, f"t_copy={t_copy:.2f}s")
    # the kills really landed mid-copy, not only before or after the work
    assert outcomes["incomplete"] >= RUNS // 3 and outcomes["parts"] >= 3, outcomes
