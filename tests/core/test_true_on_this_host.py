"""Messages say what is true on THIS host (#23): as an ordinary user on a machine without an NVIDIA driver, `check`
never calls the GPU usable, and `fix` names the missing driver (the root cause) before a missing CAP_MKNOD. Run as
uid 65534 through the installed console script (setpriv), with a HOME in a temp dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.console import console_script
from tests.core.test_h200_rerun import _diag
from tests.needs import unavailable

NOBODY = 65534


@pytest.fixture
def as_nobody():
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        unavailable("setpriv is not installed (util-linux): cannot run gpudoctor as an ordinary user")
    if os.geteuid() != 0:
        unavailable("these tests switch to uid 65534 and need root to do so")
    if Path("/proc/driver/nvidia").exists():
        unavailable("this machine has an NVIDIA driver loaded: the no-driver messages cannot be seen here")
    home = tempfile.mkdtemp(prefix=f"gpudoctor-w23-nobody-{os.getpid()}-")
    os.chown(home, NOBODY, NOBODY)

    def run(*args):
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        return subprocess.run([setpriv, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                               console_script(), *args], capture_output=True, text=True, env=env, cwd=home,
                              timeout=120)

    try:
        probe = run("--version")
        if probe.returncode != 0:
            unavailable(f"uid {NOBODY} cannot run {console_script()} here: {probe.stderr.strip()[:200]}")
        yield run
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_check_as_a_user_without_a_driver_never_calls_the_gpu_usable(as_nobody):
    r = as_nobody("check", "--json")
    assert r.returncode in (2, 3) and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    by = {f["key"]: f for f in doc["findings"]}
    assert by["host.driver.loaded"]["status"] == "fail"
    priv = by["host.privileges"]
    assert priv["summary"].startswith(f"Probes run as uid {NOBODY} (not root): ")
    assert "usable" not in priv["summary"] and "needs no root" not in priv["summary"]
    assert "root-only" in priv["summary"]


def test_fix_as_a_user_without_a_driver_blames_the_driver_first(as_nobody):
    r = as_nobody("fix")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    out = r.stdout
    assert "REFUSED  devices.node.create: " in out
    refused = next(line for line in out.splitlines() if line.startswith("REFUSED  devices.node.create"))
    assert "the NVIDIA driver is not loaded" in refused and "host.driver.loaded" in refused
    assert "cannot create device nodes" not in out  # the old CAP_MKNOD-first line
    if "CAP_MKNOD" in refused:
        assert refused.index("NVIDIA driver is not loaded") < refused.index("CAP_MKNOD")


def test_with_a_driver_loaded_the_user_is_told_the_gpu_needs_no_root():
    _, d = _diag("h200-user-healthy")
    priv = d.by_key()["host.privileges"]
    assert priv.summary == ("Probes run as uid 1001 (not root): using the GPU needs no root; 4 kinds of facts are "
                            "root-only: PCIe config space past 64 bytes, the MIG config capability, other users' GPU "
                            "processes, the kernel log (XIDs)")
