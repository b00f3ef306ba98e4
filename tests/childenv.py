"""PYTHONPATH for the child processes tests start: `tests.*` (stand-ins, harnesses) from this checkout, gpudoctor
itself from the installed package — never the source tree, whose layout is not the installed one (checks/ and
remedies/ become gpudoctor.checks and gpudoctor.remedies only when installed). A directory holding one link,
tests -> this checkout's tests/, gives exactly that."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_DIR: Path | None = None  # made on first use: the many child pythons that import this and exit by os._exit or a
                          # signal (no atexit) then leave no directory behind


def _dir() -> Path:
    global _DIR
    if _DIR is None:
        _DIR = Path(tempfile.mkdtemp(prefix="gpudoctor-tests-path-"))
        (_DIR / "tests").symlink_to(TESTS, target_is_directory=True)
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def pythonpath(*first: str | os.PathLike, env: dict | None = None) -> str:
    """`first`, then the tests-only directory, then whatever PYTHONPATH `env` (default os.environ) already has."""
    rest = (env if env is not None else os.environ).get("PYTHONPATH", "")
    return os.pathsep.join([*(str(p) for p in first), str(_dir()), *([rest] if rest else [])])
