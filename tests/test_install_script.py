"""install.sh (README line 1) for an ordinary user: a venv in ~/.local/share/gpudoctor holding a real (not editable)
install, `gpudoctor` linked into ~/.local/bin, a note while that is not on PATH, `--where` naming the venv, a second
run reusing it; bad options and a foreign directory are one line and exit 3 with nothing made.

Run as a real ordinary user (nobody, through setpriv, when the suite runs as root) with the distribution's
/usr/bin/python3, in a HOME of its own. The package's dependencies are pip's business, not install.sh's: the test
installs with PIP_NO_DEPS, no index and the build inside the venv (Debian's `wheel` module lent to it), so it needs no
network; the Debian 12 stage of CI (.ci/debian) does the whole install from the registries on a pristine system."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import needs

CHECKOUT = Path(__file__).resolve().parents[1]
NOBODY = 65534
# what `pip install .` needs of the checkout (a copy: pip builds in the source tree, which the user cannot write)
SOURCES = ("pyproject.toml", "README.md", "install.sh", "gpudoctor", "checks", "remedies")


SYSTEM_PYTHON = "/usr/bin/python3"
DEBIAN_WHEEL = "/usr/lib/python3/dist-packages/wheel"  # python3-wheel: setuptools 66 builds wheels with it
DEBIAN_SETUPTOOLS = "/usr/lib/python3/dist-packages/setuptools"  # python3-setuptools (Python >= 3.12, below)
SYSTEMD_HIDES = "which the systemd units hide (PrivateTmp=yes)"  # install.sh's note on an install under /tmp


def _under_private_tmp(path) -> bool:
    real = os.path.realpath(path)
    return any(real == t or real.startswith(t + "/") for t in ("/tmp", "/var/tmp"))


def _lines_but_the_tmp_note(stderr: str, venv: Path) -> list[str]:
    """stderr's lines less install.sh's PrivateTmp note, which it gives once exactly when the venv lies under /tmp or
    /var/tmp (the test's HOME does, wherever $TMPDIR puts it): the other notes and the line counts stay exact."""
    lines = stderr.splitlines()
    assert sum(SYSTEMD_HIDES in ln for ln in lines) == (1 if _under_private_tmp(venv) else 0), stderr
    return [ln for ln in lines if SYSTEMD_HIDES not in ln]


def _venv_lacks_setuptools() -> bool:
    """Python 3.12 stopped putting setuptools into new venvs (Debian 13's 3.13 too): the offline build of the checkout
    then needs Debian's python3-setuptools beside Debian's wheel."""
    v = subprocess.run([_system_python(), "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True,
                       text=True).stdout.strip()
    if v != "True":
        return False
    if not os.path.isdir(DEBIAN_SETUPTOOLS):
        needs.unavailable(f"the user route of install.sh on Python >= 3.12 needs Debian's setuptools{needs.MARK}: "
                          "apt-get install python3-setuptools")
    return True


def _system_python() -> str:
    """The distribution's python3, able to make a venv (python3-venv), and Debian's `wheel` module, which the
    offline build of the checkout needs (no index: setuptools' build backend cannot fetch it)."""
    ok = os.path.exists(SYSTEM_PYTHON) and subprocess.run([SYSTEM_PYTHON, "-c", "import ensurepip, venv"],
                                                          capture_output=True).returncode == 0
    if not ok or not os.path.isdir(DEBIAN_WHEEL):
        needs.unavailable(f"the user route of install.sh needs {SYSTEM_PYTHON} with venv and wheel{needs.MARK}: "
                          "apt-get install python3-venv python3-wheel")
    return SYSTEM_PYTHON


@pytest.fixture
def user_home():
    """A HOME (and a copy of the checkout in it) owned by the user the script runs as; removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="gpudoctor-install-test-"))
    try:
        src = d / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
        for name in SOURCES:
            p = CHECKOUT / name
            (shutil.copytree(p, src / name, ignore=ignore) if p.is_dir() else shutil.copy2(p, src / name))
        home = d / "home"
        home.mkdir()
        build_path = d / "pythonpath"  # only Debian's `wheel` module, for the build inside the venv
        build_path.mkdir()
        for p in Path(DEBIAN_WHEEL).parent.glob("wheel*"):  # the module and its metadata (the bdist_wheel command)
            (build_path / p.name).symlink_to(p)
        if _venv_lacks_setuptools():  # Python >= 3.12: venvs get pip only; Debian's setuptools builds it then
            for p in [*Path(DEBIAN_SETUPTOOLS).parent.glob("setuptools*"), *(Path(DEBIAN_SETUPTOOLS).parent / n
                      for n in ("pkg_resources", "_distutils_hack"))]:
                if p.exists():
                    (build_path / p.name).symlink_to(p)
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                needs.missing("unshare", "setpriv (util-linux)")
            for p in [d, *d.rglob("*")]:  # lchown: the wheel link itself
                os.lchown(p, NOBODY, NOBODY)
        yield home, src, build_path
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_install(user, *args: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    home, src, build_path = user
    # no dependencies, no index, the build in the venv itself (setuptools from the venv, wheel from build_path)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHON": _system_python(),
           "PIP_NO_DEPS": "1", "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PYTHONPATH": str(build_path),
           "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1", **(extra_env or {})}
    argv = [str(src / "install.sh"), *args]
    if os.geteuid() == 0:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    return subprocess.run(argv, env=env, cwd=str(home), capture_output=True, text=True, timeout=240)


def test_an_ordinary_users_install_lands_in_local_bin_linked_to_its_own_venv(user_home):
    home, src, _ = user_home
    venv, link = home / ".local/share/gpudoctor", home / ".local/bin/gpudoctor"
    r = run_install(user_home)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(venv / "bin/gpudoctor")
    script = (venv / "bin/gpudoctor").read_text()
    assert script.startswith(f"#!{venv}/bin/python")  # the venv's interpreter: no PATH needed to run it
    assert f"{home}/.local/bin is not on your PATH" in r.stderr and len(_lines_but_the_tmp_note(r.stderr, venv)) <= 4
    # the test's HOME lies under /tmp: the systemd units (PrivateTmp=yes) could not start this install (#49: exit 203)
    assert _under_private_tmp(venv) and SYSTEMD_HIDES in r.stderr, r.stderr
    from gpudoctor.commands.daemon import install_problem  # what `gpudoctor daemon --check-install` says of it

    why = install_problem([str(venv / "bin/python"), str(link)])  # (this venv has no dependencies to run it)
    assert why and "which the systemd units hide (PrivateTmp=yes): they cannot start it (status=203/EXEC)" in why
    here = subprocess.run(["gpudoctor" if shutil.which("gpudoctor") else str(Path(sys.executable).parent / "gpudoctor"),
                           "daemon", "--check-install"], capture_output=True, text=True, timeout=60)
    assert here.returncode == (3 if install_problem() else 0) and len((here.stdout + here.stderr).splitlines()) == 1
    meta = subprocess.run([str(venv / "bin/python"), "-c",
                           "import importlib.metadata as m, json; d = m.distribution('gpudoctor');"
                           "print(json.dumps([d.version, d.read_text('direct_url.json')]))"],
                          capture_output=True, text=True, timeout=60)
    version, direct_url = json.loads(meta.stdout)
    assert version == "0.1.0" and json.loads(direct_url).get("dir_info", {}).get("editable") is not True
    assert not list(venv.glob("lib/python3*/site-packages/__editable__*"))  # a real copy, as a user installs
    where = run_install(user_home, "--where")
    assert (where.returncode, where.stdout) == (0, f"{venv}\n")
    # again (an upgrade): the same venv, reinstalled; the note is gone once ~/.local/bin is on PATH
    (venv / "marker").write_text("kept")
    again = run_install(user_home, extra_env={"PATH": f"{home}/.local/bin:/usr/bin:/bin"})
    assert again.returncode == 0, again.stderr
    assert (venv / "marker").read_text() == "kept" and "not on your PATH" not in again.stderr


@pytest.mark.parametrize("args, env, line", [
    (["--bogus"], {}, "install.sh: unknown option '--bogus' (see ./install.sh --help)"),
    (["--extras", "test;rm"], {}, "install.sh: --extras 'test;rm': only comma-separated extra names (test,plots)"),
    (["--extras", "test,plotz"], {}, "install.sh: --extras: unknown extra 'plotz' (valid: plots,tokenizers,test)"),
    (["--wheels", "/nonexistent"], {}, "install.sh: --wheels /nonexistent: no such directory"),
    ([], {"PYTHON": "/nonexistent/python3"},
     "install.sh: /nonexistent/python3: not found (Debian/Ubuntu, as root: apt-get update && apt-get install python3; "
     "or set PYTHON=)"),
    (["--run"], {}, "install.sh: --run needs a gpudoctor command (e.g. --run check)"),
])
def test_bad_input_is_one_line_exit_3_and_nothing_is_made(user_home, args, env, line):
    home, src, _ = user_home
    r = run_install(user_home, *args, extra_env=env)
    assert (r.returncode, r.stderr, r.stdout) == (3, line + "\n", "")
    assert list(home.iterdir()) == []


def test_a_directory_that_is_not_a_venv_is_left_alone(user_home):
    home, src, _ = user_home
    mine = home / "data"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    r = run_install(user_home, extra_env={"GPUDOCTOR_HOME": str(mine)})
    assert r.returncode == 3
    assert r.stderr == f"install.sh: {mine} exists and is not a virtual environment: move it away or set GPUDOCTOR_HOME\n"
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and not (home / ".local").exists()


def test_run_uses_this_install_and_says_which_gpudoctor_the_shell_would_run(user_home):
    """README line 1 (`./install.sh --run check`) as an ordinary user: ~/.local/bin is not on PATH yet, and root's
    /usr/local/bin/gpudoctor (here a stand-in earlier on PATH) would answer `gpudoctor`. install.sh says so in one line
    and runs its own install by full path, never the other one (#34)."""
    home, src, _ = user_home
    other = home.parent / "other-bin"
    other.mkdir()
    (other / "gpudoctor").write_text("#!/bin/sh\necho 'gpudoctor 0.0.9 (root)'; echo OTHER-INSTALL-RAN >&2\n")
    (other / "gpudoctor").chmod(0o755)
    link = home / ".local/bin/gpudoctor"
    # --run's command: `--version` of this install's script (no dependencies are installed offline here; the
    # trixie stage of .ci/debian runs the real `--run check` as a new user, exit 2)
    r = run_install(user_home, "--run", "--version", extra_env={"PATH": f"{other}:/usr/bin:/bin"})
    assert "OTHER-INSTALL-RAN" not in r.stderr  # the other install's --version was read, never its `--run` command
    venv = home / ".local/share/gpudoctor"
    notes = [ln for ln in _lines_but_the_tmp_note(r.stderr, venv) if ln.startswith("install.sh: note:")]
    assert notes == [f"install.sh: note: `gpudoctor` in this shell is {other}/gpudoctor (another install: gpudoctor "
                     f"0.0.9 (root)), not this one: run {link.parent}/gpudoctor, or put {link.parent} first on PATH"]
    assert f"install.sh: running this install's {link} --version" in r.stderr
    # nothing on PATH at all: the PATH line, and --run still runs this install
    r = run_install(user_home, "--run", "--version")
    rest = "\n".join(_lines_but_the_tmp_note(r.stderr, venv))
    assert f"{home}/.local/bin is not on your PATH yet" in rest and "note:" not in rest
    assert f"install.sh: running this install's {link} --version" in r.stderr
    # this install first on PATH: not a word about it
    r = run_install(user_home, "--run", "--version", extra_env={"PATH": f"{link.parent}:{other}:/usr/bin:/bin"})
    rest = "\n".join(_lines_but_the_tmp_note(r.stderr, venv))
    assert "note:" not in rest and "running this install's" not in rest and "not on your PATH" not in rest


def test_a_checkout_the_user_cannot_write_installs_and_is_left_as_it_was(user_home):
    """pip built in the checkout (build/, gpudoctor.egg-info): a checkout root owns failed with pip's wall of text
    for another user, and one the user owns was left with both (#49). install.sh builds a copy in a temp dir."""
    home, src, _ = user_home
    if os.geteuid() != 0:
        needs.unavailable("a checkout the installing user cannot write needs root to make")
    for p in [src, *src.rglob("*")]:
        os.lchown(p, 0, 0)  # root's checkout, readable by all, writable by root only
    r = run_install(user_home)
    assert r.returncode == 0, r.stderr
    assert (home / ".local/bin/gpudoctor").is_symlink()
    assert not list(src.glob("build")) and not list(src.rglob("*.egg-info")), "the build was left in the checkout"
    secret = src / "gpudoctor" / "unreadable.py"
    secret.write_text("")
    secret.chmod(0o600)
    bad = run_install(user_home)
    assert bad.returncode == 3 and bad.stderr.splitlines()[-1].startswith(
        f"install.sh: cannot read the checkout {src} to build it: "), bad.stderr
    assert "Permission denied" in bad.stderr.splitlines()[-1] and "Traceback" not in bad.stderr
