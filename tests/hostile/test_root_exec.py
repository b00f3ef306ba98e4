"""Root never executes or imports what another user controls (#40, docs/security.md).

The attacker is uid 65534 with a shell: it starts a process whose command line looks like an SGLang server (argv[0]
forged, as `exec -a` does) naming an interpreter it owns, or plants json.py in a directory root works in. Each of
its programs would leave a marker file if root ran it; the tests assert no marker, and that the healthy path (a
root-owned interpreter found the same way) still works.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import needs
from tests.console import gpudoctor
from tests.hostile.attacker import NOBODY, attacker_dir, executable, owned_by

from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost

# What the attacker's "python" does when anyone runs it: leave a marker line (its uid, the pids of its ancestors, its
# arguments), and claim torch so that it would be chosen.
EVIL = r"""#!/bin/sh
p=$$ up=""
while [ "${{p:-0}}" -ge 1 ]; do up="$up $p"; [ "$p" = 1 ] && break; p=$(sed -n 's/.*) . \([0-9]*\) .*/\1/p' /proc/$p/stat); done
echo "$(id -u) [$up ] $*" >> {marker}
echo 2.9.0+cu130
"""


def ran_here(marker: Path) -> list[str]:
    """The marker's lines left by a run this test process started (another gpudoctor on the machine — from main,
    without the fix — may find this test's forged server too, and run the attacker's python from its own process).
    The ancestry goes up to PID 1 inclusive: in CI's Debian 13 stage pytest is PID 1 of its own namespace."""
    me = f" {os.getpid()} "
    return [ln for ln in (marker.read_text().splitlines() if marker.exists() else []) if me in ln]


def forged_server(argv0: str, *more: str) -> subprocess.Popen:
    """A process whose /proc/PID/cmdline is `argv0 -m sglang.launch_server ...` (exec -a), really a sleeping python."""
    proc = subprocess.Popen([argv0, "-c", "import time; time.sleep(120)", "-m", "sglang.launch_server", *more],
                            executable=sys.executable, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if b"sglang.launch_server" in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                break
        except OSError:
            pass
        time.sleep(0.02)
    return proc


@pytest.fixture
def stop():
    procs = []
    yield procs.append
    for p in procs:
        p.kill()
        p.wait()


def search(**policy) -> dict:
    from gpudoctor.gather.deep_python import choose

    return choose(LocalHost(), GatherContext(name="here", policy={"deep": True, **policy}))


def mine(pick: dict, path: str) -> dict:
    return next(c for c in pick["candidates"] if c["python"] == path)


@pytest.mark.parametrize("how", ["owned-by-the-attacker", "in-a-world-writable-directory", "a-root-link-into-its-home",
                                 "a-script-whose-shebang-names-it"])
def test_a_server_interpreter_root_cannot_trust_is_never_run(tmp_path, stop, how):
    needs.root()
    marker = tmp_path / "ran"
    home = attacker_dir(tmp_path)
    evil = executable(home / "python3", EVIL.format(marker=marker))
    argv0 = str(evil)
    if how == "in-a-world-writable-directory":  # root's own file, but anyone may swap it
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o777)
        shared.chmod(0o777)
        argv0 = str(executable(shared / "python3", EVIL.format(marker=marker), uid=0))
    elif how == "a-root-link-into-its-home":  # a root-owned link whose target the attacker controls
        root_dir = tmp_path / "opt"
        root_dir.mkdir()
        (root_dir / "python3").symlink_to(evil)
        argv0 = str(root_dir / "python3")
    elif how == "a-script-whose-shebang-names-it":  # `#!/home/eve/python3` at the top of the attacker's script
        script = executable(home / "serve", f"#!{evil}\n")
        stop(subprocess.Popen([str(script), "-c", "import time; time.sleep(120)", "sglang.launch_server"],
                              executable=sys.executable, stdin=subprocess.DEVNULL))
        time.sleep(0.3)
    if how != "a-script-whose-shebang-names-it":
        stop(forged_server(argv0))
    pick = search()
    assert not ran_here(marker), f"root ran the attacker's interpreter: {ran_here(marker)}"
    named = str(evil) if how == "a-script-whose-shebang-names-it" else argv0
    cand = mine(pick, named)
    assert cand["torch"] is None and "not trusted as root" in cand["error"]
    part = {"owned-by-the-attacker": f"owned by nobody (uid {NOBODY})", "a-root-link-into-its-home": "(uid 65534)",
            "in-a-world-writable-directory": "writable by every user (mode 0777)",
            "a-script-whose-shebang-names-it": f"owned by nobody (uid {NOBODY})"}[how]
    assert part in cand["error"], cand
    assert pick["python"] != [named]
    from gpudoctor.gather.deep_python import describe

    said = describe(pick)  # the deep tier's evidence line says why that interpreter was not used
    assert f"{named} (" in said and said.endswith("not trusted as root") and part in said, said


def test_a_root_owned_server_interpreter_is_still_asked(stop):
    """The healthy path: the serving stack's python, root's, is asked (here it has no torch, and says so)."""
    needs.root()
    py = os.path.realpath("/usr/bin/python3")
    stop(forged_server(py))
    cand = mine(search(), py)
    assert cand["error"] == "no torch installed" and cand["source"].startswith("the SGLang server's interpreter")


def test_an_interpreter_the_attacker_owns_is_used_when_a_trusted_source_names_it(tmp_path):
    """--deep-python (or the inventory's policy) is root's own decision: the trust test is for what a process says."""
    needs.root()
    marker = tmp_path / "ran"
    evil = executable(attacker_dir(tmp_path) / "python3", EVIL.format(marker=marker))
    pick = search(torch_python=str(evil))
    assert pick["source"] == "--deep-python" and pick["torch"] == "2.9.0+cu130"
    assert ran_here(marker) and all("] -I -c" in ln for ln in ran_here(marker))  # asked isolated


def hostile_cwd(tmp_path: Path, marker: Path) -> Path:
    """A directory the attacker owns and everyone may write, with modules a python started there would import."""
    d = attacker_dir(tmp_path, "work", mode=0o777)
    for mod in ("json", "sys_", "time", "urllib", "base64", "os", "hashlib", "importlib", "encodings", "ctypes",
                "torch", "signal", "contextlib"):
        (d / f"{mod}.py").write_text(f"open({str(marker)!r}, 'a').write({mod!r} + ' ')\n")
        owned_by(d / f"{mod}.py")
    return d


def test_child_pythons_import_nothing_from_a_hostile_working_directory(tmp_path, monkeypatch):
    """`check --sglang-url` (the workload probe), the deep child, SGLang's resolver: run as root in a directory another
    user writes, with json.py etc. planted there."""
    needs.root()
    marker = tmp_path / "imported"
    cwd = hostile_cwd(tmp_path, marker)
    r = gpudoctor("check", "--sglang-url", "http://127.0.0.1:9", "--json", cwd=cwd,
                  env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GPUDOCTOR_INVENTORY": ""})
    assert "Traceback" not in r.stderr
    assert not marker.exists(), f"a child python imported the working directory's {marker.read_text()}"

    from gpudoctor.gather import deep
    from gpudoctor.sglang.resolver import resolve_with_sglang

    monkeypatch.chdir(cwd)
    deep._measure(LocalHost(), [sys.executable], 1, {"gpus": ["GPU0"]}, 1024, GatherContext(name="here", timeout=20))
    resolve_with_sglang(["--model-path", "x"], python=sys.executable, timeout=60)
    assert not marker.exists(), f"a child python imported the working directory's {marker.read_text()}"


class Recording(LocalHost):
    """LocalHost that keeps every argv it runs."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.argvs: list[list[str]] = []

    def run(self, argv, timeout=None, input=None, env=None):
        self.argvs.append(list(argv))
        return super().run(argv, timeout=timeout, input=input, env=env)


def test_every_python_a_gather_starts_is_isolated(tmp_path):
    """Structural: each interpreter a full gather (every subsystem, a model path, a serving URL) and the deep python
    search start gets -I right after the interpreter."""
    from gpudoctor.gather import gather
    from gpudoctor.gather.deep_python import choose

    host = Recording()
    ctx = GatherContext(name="here", timeout=10, sglang_url="http://127.0.0.1:9", model_paths=[str(tmp_path)],
                        policy={"deep": True})
    gather(host, ctx)
    choose(host, ctx)
    pythons = [a for a in host.argvs if a and a[:len(host.python)] == list(host.python)]
    assert len(pythons) >= 5, host.argvs
    bare = [a[:3] + ["..."] for a in pythons if a[len(host.python)] != "-I"]
    assert not bare, bare
