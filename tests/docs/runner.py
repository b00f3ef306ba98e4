"""Run a gpudoctor command line the way a user's shell would, fast: a fork of this (pytest's) process runs
`gpudoctor.cli.main(argv)` with stdin on /dev/null, stdout and stderr on one pipe (their interleaving as a terminal
shows it), NO_COLOR, TERM=dumb, COLUMNS=120, the repository root as working directory and a fresh temporary directory
as $TMPDIR, with $GPUDOCTOR_STATE_DIR and $STATE_DIRECTORY under it (no example reads or leaves this machine's
state, the recovery ladder's file included). The fork is the isolation (nothing a command changes reaches the next);
what it saves is the interpreter's start and gpudoctor's imports: the first run of each command tells which modules
it imported, and the parent imports them before the next fork (a replay then takes ~20 ms instead of ~0.3 s in a new
interpreter)."""

from __future__ import annotations

import importlib
import io
import json
import os
import select
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}
_learned: set[str] = set()  # command names whose modules are preloaded


@dataclass
class Result:
    code: int
    text: str       # stdout and stderr, interleaved
    tmp: str        # the run's $TMPDIR (gone after the run), for the normaliser


def _child(argv: list[str], w: int, modw: int, tmp: str) -> None:
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(w, 1)
        os.dup2(w, 2)
        os.chdir(ROOT)
        os.environ.pop("GPUDOCTOR_INVENTORY", None)
        state = os.path.join(tmp, "state")  # gpudoctor's state and the recovery ladder's ($STATE_DIRECTORY)
        os.makedirs(state)
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


def run(cmd: str, timeout: float = 120) -> Result:
    """The command line `cmd` ("gpudoctor …", a `# comment` allowed) run in a fork (see the module's docstring)."""
    argv = shlex.split(cmd, comments=True)
    assert argv[0] == "gpudoctor", cmd
    argv = argv[1:]
    name = next((a for a in argv if not a.startswith("-")), "")
    with tempfile.TemporaryDirectory(prefix="gpudoctor-doc.") as tmp:
        r, w = os.pipe()
        mr, mw = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(mr)
            _child(argv, w, mw, tmp)
        os.close(w)
        os.close(mw)
        data = None
        try:
            data = _read(r, time.monotonic() + timeout)
        finally:
            if data is None:
                os.kill(pid, signal.SIGKILL)
            mods = _read(mr, time.monotonic() + 5) or b"[]"
            _, status = os.waitpid(pid, 0)
        assert data is not None, f"$ {cmd}: no end after {timeout} s (killed)"
        if name not in _learned:
            _learned.add(name)
            for m in json.loads(mods):
                if m.startswith(("gpudoctor", "click", "yaml", "json", "concurrent")) or "." not in m:
                    try:
                        importlib.import_module(m)
                    except Exception:  # noqa: BLE001 - a module only the child could import: it imports it again
                        pass
        return Result(os.waitstatus_to_exitcode(status), data.decode("utf-8", "replace"), tmp)
