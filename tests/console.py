"""The installed `gpudoctor` console script: the command a user types, not `python -m gpudoctor`, for tests about
what only the script shows (its pipes, its start, its help)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.needs import unavailable


def console_script() -> str:
    """The `gpudoctor` script pip installed for this interpreter (its scripts directory, or beside sys.executable)."""
    for d in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        p = Path(d) / "gpudoctor"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    unavailable(f"no gpudoctor console script beside {sys.executable} (install gpudoctor with pip, README line 1)")
    raise AssertionError  # unreachable: unavailable() skips or fails


def gpudoctor(*args, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Run the console script with ARGS: exit code, stdout and stderr as a user sees them."""
    return subprocess.run([console_script(), *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def commands(group, prefix=()):
    """Every (path, command) under a click group that a user sees, depth first: ("lxc",), ("lxc", "audit"), …
    (a hidden command, such as the job a Slurm campaign's script runs, is no user's command)"""
    import click

    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if getattr(cmd, "hidden", False):
            continue
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from commands(cmd, prefix + (name,))


def drain(fd: int, timeout: float) -> bytes:
    """Everything a pty's (or pipe's) reading end gives until the writer closes it (EOF, or EIO on a pty) or
    `timeout` seconds pass."""
    import time

    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)
