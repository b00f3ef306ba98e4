"""install.sh as root is an install for every user (#41): when root's python3 lies under a directory others cannot
enter (pyenv's /root/.pyenv under a 0700 /root, as on this machine), /usr/local/bin/gpudoctor failed for them with
"bad interpreter: Permission denied" (126). The venv is now made with the distribution's /usr/bin/python3 (said in one
line), and a PYTHON= that names the private one is kept with a one-line note. Offline, as tests/test_install_script.py
installs: no dependencies, the build in the venv with Debian's wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import needs
from tests.test_install_script import CHECKOUT, NOBODY, SOURCES, _system_python, _venv_lacks_setuptools, \
    DEBIAN_SETUPTOOLS, DEBIAN_WHEEL


@pytest.fixture
def root_box():
    """A world-enterable directory with a copy of the checkout, a private dir (0700) holding root's `python3`
    (a link to the distribution's, as pyenv's shim leads to a private interpreter), and Debian's wheel for the build."""
    needs.root()
    if not shutil.which("setpriv"):
        needs.missing("unshare", "setpriv (util-linux)")
    system = _system_python()
    d = Path(tempfile.mkdtemp(prefix="gpudoctor-install-root-"))
    try:
        d.chmod(0o755)
        src = d / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
        for name in SOURCES:
            p = CHECKOUT / name
            (shutil.copytree(p, src / name, ignore=ignore) if p.is_dir() else shutil.copy2(p, src / name))
        private = d / "private"
        private.mkdir(mode=0o700)
        (private / "python3").symlink_to(system)
        build = d / "pythonpath"
        build.mkdir()
        for p in Path(DEBIAN_WHEEL).parent.glob("wheel*"):
            (build / p.name).symlink_to(p)
        if _venv_lacks_setuptools():
            for p in [*Path(DEBIAN_SETUPTOOLS).parent.glob("setuptools*"), *(Path(DEBIAN_SETUPTOOLS).parent / n
                      for n in ("pkg_resources", "_distutils_hack"))]:
                if p.exists():
                    (build / p.name).symlink_to(p)
        yield d, src, private, build
    finally:
        shutil.rmtree(d, ignore_errors=True)


def install_as_root(box, **env) -> tuple[subprocess.CompletedProcess, Path]:
    d, src, private, build = box
    venv = d / "venv"
    base = {"HOME": str(d), "PATH": f"{private}:/usr/bin:/bin", "LANG": "C.UTF-8", "PIP_NO_DEPS": "1",
            "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PYTHONPATH": str(build), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1",
            "GPUDOCTOR_HOME": str(venv), "GPUDOCTOR_BIN": str(d / "bin"), "GPUDOCTOR_MAN": str(d / "man")}
    r = subprocess.run([str(src / "install.sh")], env={**base, **env}, cwd=str(d), capture_output=True, text=True,
                       timeout=240)
    return r, venv


def runs_for_nobody(python: Path) -> subprocess.CompletedProcess:
    # through a shell, as a user runs it (setpriv's own exec of the path is not what a user's shell does)
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "/bin/sh", "-c",
                           '"$0" -I -c "import gpudoctor"', str(python)], capture_output=True, text=True, timeout=60,
                          cwd="/")


def test_roots_private_python3_is_passed_over_for_the_distributions(root_box):
    d, src, private, build = root_box
    git = shutil.which("git")
    if git is None:
        needs.missing("git")
    for argv in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run([git, "-C", str(src), *argv], check=True, capture_output=True, timeout=60)
    head = subprocess.run([git, "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    # the suite's own dependencies (not its gpudoctor) lent to the new venv's gpudoctor: the install takes none
    lent = d / "deps"
    lent.mkdir()
    for site in (p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)):
        for entry in os.scandir(site):
            if not entry.name.startswith(("gpudoctor", "__editable__", "_distutils_hack")) \
                    and not entry.name.endswith(".pth") and not (lent / entry.name).exists():
                (lent / entry.name).symlink_to(entry.path)
    deps = f"{build}:{lent}"
    r, venv = install_as_root(root_box, PYTHONPATH=deps, GPUDOCTOR_MAN="")
    assert r.returncode == 0, r.stderr
    line = (f"install.sh: python3 lies under {private}, which other users cannot enter: the venv uses "
            f"/usr/bin/python3, so every user can run gpudoctor")
    assert line in r.stderr.splitlines(), r.stderr
    assert not os.path.realpath(venv / "bin/python").startswith(str(private))
    ok = runs_for_nobody(venv / "bin/python")
    assert ok.returncode == 0, ok.stderr  # it was 126, "bad interpreter: Permission denied"
    # the manual page beside the command (GPUDOCTOR_BIN's share/man), and --version names the checkout's commit
    page = d / "share/man/man1/gpudoctor.1"
    assert page.read_text().startswith(".TH GPUDOCTOR 1"), r.stderr
    v = subprocess.run([str(d / "bin/gpudoctor"), "--version"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": deps})
    assert v.stdout.endswith(f"(commit {head[:12]})\n"), v.stdout + v.stderr


def test_a_private_python_named_by_PYTHON_is_kept_with_one_line_that_says_so(root_box):
    d, _, private, _ = root_box
    r, venv = install_as_root(root_box, PYTHON=str(private / "python3"))
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "other users cannot enter" in ln]
    assert notes == [f"install.sh: note: {private}/python3 lies under {private}, which other users cannot enter: "
                     f"{d}/bin/gpudoctor will run for root only (set PYTHON= to a python3 every user can run)"]
    assert runs_for_nobody(venv / "bin/python").returncode == 126  # the note is true
