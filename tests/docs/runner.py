"""Run a gpudoctor command line the way a user's shell would, fast.

One child python (this file run as a script: it imports only the installed gpudoctor and the standard library) is
started at the first `run()` and kept for the session; for each command it forks, and the fork runs
`gpudoctor.cli.main(argv)` with stdin on /dev/null, stdout and stderr on one pipe (their interleaving as a terminal
shows it), NO_COLOR, TERM=dumb, COLUMNS=120, the repository root as working directory and a fresh temporary directory
as $TMPDIR, with $GPUDOCTOR_STATE_DIR and $STATE_DIRECTORY under it (no example reads or leaves this machine's
state, the recovery ladder's file included). The fork is the isolation (nothing a command changes reaches the next);
the child is single-threaded, so a fork never inherits a lock another thread held (pytest's process may have
threads). What it saves is the interpreter's start and gpudoctor's imports: the first run of each command tells which
modules it imported, and the child imports them before the next fork (a replay then takes ~20 ms instead of ~0.3 s
in a new interpreter)."""

from __future__ import annotations

import atexit
import importlib
import io
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}


@dataclass
class Result:
    code: int
    text: str       # stdout and stderr, interleaved
    tmp: str        # the run's $TMPDIR (gone after the run), for the normaliser


# --- the child (this file as a script) ---------------------------------------------------------------------------

def _command(argv: list[str], w: int, modw: int, tmp: str) -> None:
    """In the fork: run one command line, its output to `w`, the modules it imported to `modw`, then _exit."""
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.chdir(ROOT)
        state = os.path.join(tmp, "state")
        os.makedirs(state)
        os.environ.pop("GPUDOCTOR_INVENTORY", None)
        os.environ.update(ENV, TMPDIR=tmp, GPUDOCTOR_STATE_DIR=state, STATE_DIRECTORY=state)
        tempfile.tempdir = None
        out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace",
                               line_buffering=True)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = sys.stderr = sys.__stdout__ = sys.__stderr__ = out
        before = set(sys.modules)
        code = 0
        try:
            from gpudoctor.cli import main

            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - a traceback is a failure the test reports
            import traceback

            traceback.print_exc()
            code = 99
        try:
            out.flush()
        except OSError:
            pass
        os.write(modw, json.dumps(sorted(set(sys.modules) - before)).encode())
        os._exit(code)
    finally:
        os._exit(98)


def _read(fd: int, deadline: float) -> bytes | None:
    """All of a pipe until its writer closes it; None when `deadline` passes first."""
    chunks = []
    while True:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            os.close(fd)
            return None
        b = os.read(fd, 1 << 16)
        if not b:
            break
        chunks.append(b)
    os.close(fd)
    return b"".join(chunks)


def _one(argv: list[str], timeout: float, learned: set[str]) -> dict:
    name = next((a for a in argv if not a.startswith("-")), "")
    with tempfile.TemporaryDirectory(prefix="gpudoctor-doc.") as tmp:
        r, w = os.pipe()
        mr, mw = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(mr)
            _command(argv, w, mw, tmp)
        os.close(w)
        os.close(mw)
        data = _read(r, time.monotonic() + timeout)
        if data is None:
            os.kill(pid, signal.SIGKILL)
        mods = _read(mr, time.monotonic() + 5) or b"[]"
        _, status = os.waitpid(pid, 0)
        if name not in learned:  # preload what this command imported, for its next run
            learned.add(name)
            for m in json.loads(mods):
                try:
                    importlib.import_module(m)
                except Exception:  # noqa: BLE001 - a module only its fork could import: the fork imports it again
                    pass
        if data is None:
            return {"code": None, "text": f"no end after {timeout} s (killed)", "tmp": tmp}
        return {"code": os.waitstatus_to_exitcode(status), "text": data.decode("utf-8", "replace"), "tmp": tmp}


def serve() -> None:
    """The child's loop: one JSON request a line on stdin ({"argv", "timeout"}), one JSON answer a line on stdout."""
    import gpudoctor.cli  # noqa: F401 - imported once, here

    learned: set[str] = set()
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    for line in sys.stdin:
        req = json.loads(line)
        replies.write(json.dumps(_one(req["argv"], req["timeout"], learned)) + "\n")
        replies.flush()


# --- the test side -----------------------------------------------------------------------------------------------

_child: subprocess.Popen | None = None


def _server() -> subprocess.Popen:
    global _child
    if _child is None or _child.poll() is not None:
        _child = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT)
        atexit.register(_child.kill)
    return _child


def run(cmd: str, timeout: float = 120) -> Result:
    """The command line `cmd` ("gpudoctor …", a `# comment` allowed), run in a fork of the child."""
    argv = shlex.split(cmd, comments=True)
    assert argv[0] == "gpudoctor", cmd
    child = _server()
    child.stdin.write(json.dumps({"argv": argv[1:], "timeout": timeout}) + "\n")
    child.stdin.flush()
    if not select.select([child.stdout], [], [], timeout + 30)[0]:
        child.kill()
        raise AssertionError(f"$ {cmd}: the runner did not answer in {timeout + 30} s")
    line = child.stdout.readline()
    assert line, f"$ {cmd}: the runner exited ({child.wait()})"
    rep = json.loads(line)
    assert rep["code"] is not None, f"$ {cmd}: {rep['text']}"
    return Result(rep["code"], rep["text"], rep["tmp"])


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    serve()
