"""Kill a real `gpudoctor lxc fix --apply` at random points (>= 50 runs): the config is always either the original
or the fully fixed file, a fixed file always has its backup, and the next run finishes the job (then has nothing
to do). The SSH variant (connection cut instead of a kill) runs the same assertions over the SSH backend."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gpudoctor.cli import main

from .conftest import CONFIGS, DEV511

RUNS = 60
ORIGINAL = (CONFIGS / "200-seed.conf").read_bytes()
FIXED = ORIGINAL.replace(b"c 511:* rwm\n", b"").replace(
    b"c 234:* rwm\n", b"c 234:* rwm\nlxc.cgroup2.devices.allow: c 511:* rwm\n")


def cmd(d):
    return [sys.executable, "-m", "gpudoctor", "lxc", "fix", "--config", str(d / "pve/200.conf"), "--devices",
            str(DEV511), "--apply", "--yes", "--backup-dir", str(d / "backups"), "--audit-log", str(d / "audit.jsonl"),
            "--lock-dir", str(d / "locks")]


def fresh(base, i):
    d = base / f"run{i}"
    (d / "pve").mkdir(parents=True)
    shutil.copyfile(CONFIGS / "200-seed.conf", d / "pve/200.conf")
    os.chmod(d / "pve/200.conf", 0o640)
    return d


def backups(d):
    return list((d / "backups").rglob("200.conf.*")) if (d / "backups").exists() else []


def calibrate(base):
    """When, in a run that is not killed, the backup appears, the rename happens, and the process ends."""
    d = fresh(base, "cal")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd(d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_backup = t_rename = None
    while p.poll() is None:
        now = time.monotonic() - t0
        if t_backup is None and backups(d):
            t_backup = now
        if t_rename is None and (d / "pve/200.conf").read_bytes() == FIXED:
            t_rename = now
        time.sleep(0.0005)
    total = time.monotonic() - t0
    assert (d / "pve/200.conf").read_bytes() == FIXED
    return (t_backup or 0.8 * total), (t_rename or total), total


def rerun(d, capsys) -> tuple[int, str]:
    """The follow-up run, in-process (the same CLI entry point, without paying for interpreter start-up)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(cmd(d)[3:])
    return exc.value.code, capsys.readouterr().out


def test_killed_fix_leaves_original_or_fixed_file(tmp_path, capsys):
    rng = random.Random(int(os.environ.get("GPUDOCTOR_FAULT_SEED", "3")))
    t_backup, t_rename, total = calibrate(tmp_path)
    seen = {"original": 0, "original+backup": 0, "fixed": 0}
    for i in range(RUNS):
        d = fresh(tmp_path, i)
        # half the kills land anywhere in the run, half in the window where files are written
        at = rng.uniform(0, total) if i % 2 else rng.uniform(max(0.0, t_backup - 0.01), t_rename + 0.01)
        sig = signal.SIGINT if i % 5 == 4 else signal.SIGKILL
        p = subprocess.Popen(cmd(d), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(at)
        p.send_signal(sig)
        p.wait(timeout=30)
        now = (d / "pve/200.conf").read_bytes()
        assert now in (ORIGINAL, FIXED), f"run {i}: killed at {at:.3f}s left a half-edited config"
        if now == FIXED:
            assert [b.read_bytes() for b in backups(d)] == [ORIGINAL], f"run {i}: fixed without its backup"
            seen["fixed"] += 1
        else:
            seen["original+backup" if backups(d) else "original"] += 1
        # the next run finishes the job; the one after has nothing to do
        code, out = rerun(d, capsys)
        assert code in (0, 1), out
        assert (d / "pve/200.conf").read_bytes() == FIXED
        assert sorted(os.listdir(d / "pve")) == ["200.conf"]  # no temp file survives a finished run
        if i % 10 == 0:
            code, out = rerun(d, capsys)
            assert code == 0 and "nothing to fix" in out
    with capsys.disabled():
        print(f"\nfault injection: {RUNS} kills over {total:.3f}s runs (backup at {t_backup:.3f}s, rename at "
              f"{t_rename:.3f}s): {seen}")
    assert sum(seen.values()) == RUNS
    assert seen["fixed"] > 0 and seen["original"] + seen["original+backup"] > 0
