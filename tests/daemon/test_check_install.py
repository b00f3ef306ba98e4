"""`gpudoctor daemon --check-install`: the shipped units run with PrivateTmp=yes, so a gpudoctor (or the python it
runs) under /tmp or /var/tmp is hidden from them and systemd says only status=203/EXEC. The command says so in one
line (exit 3), or that the units can start this install (exit 0); the systemd lab skips on the same judgment (#49)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpudoctor.commands.daemon import install_problem

CHECKOUT = Path(__file__).resolve().parents[2]


def _check_install(pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "gpudoctor", "daemon", "--check-install"], capture_output=True,
                          text=True, env=env, cwd="/", timeout=60)


def test_a_path_under_tmp_is_judged_as_written_and_resolved():
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        (d / "bin").mkdir()
        (d / "bin/python").symlink_to("/usr/bin/python3")  # a venv's python: the link itself lies under /tmp
        why = install_problem([str(d / "bin/python")])
        assert why == (f"{d}/bin/python lies under /tmp, which the systemd units hide (PrivateTmp=yes): they cannot "
                       "start it (status=203/EXEC); install gpudoctor elsewhere (./install.sh as root: /opt/gpudoctor)")
        assert install_problem(["/var/tmp/gd/lib/python3/site-packages/gpudoctor"]).startswith(
            "/var/tmp/gd/lib/python3/site-packages/gpudoctor lies under /var/tmp,")
        assert install_problem(["/opt/gpudoctor/bin/python", "/usr/bin/python3", "/tmpfoo/bin/python"]) is None
    finally:
        (d / "bin/python").unlink()
        (d / "bin").rmdir()
        d.rmdir()


def test_check_install_says_in_one_line_whether_the_units_can_start_it():
    here = _check_install()
    if install_problem() is None:  # this checkout's own install (outside /tmp, as CI's /opt venv)
        assert (here.returncode, here.stderr) == (0, ""), here.stderr
        assert here.stdout == "the systemd units can start this gpudoctor (it does not lie under /tmp or /var/tmp)\n"
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        (d / "gpudoctor").symlink_to(CHECKOUT / "gpudoctor")  # the package itself imported from under /tmp
        r = _check_install(str(d))
        assert r.returncode == 3 and r.stdout == "", r.stdout + r.stderr
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
        assert f"{d}/gpudoctor lies under /tmp, which the systemd units hide (PrivateTmp=yes)" in r.stderr, r.stderr
    finally:
        (d / "gpudoctor").unlink()
        d.rmdir()
