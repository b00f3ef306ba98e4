"""How gpudoctor's bench marks the servers it starts, so that a later check can tell them from a stranger's process
and tell whether the campaign that started them is still there.

Every server (local or on an inventory host) gets three environment variables, inherited by its children:

    GPUDOCTOR_BENCH_RUN    the campaign's run directory (on the target for a remote server)
    GPUDOCTOR_BENCH_LABEL  the configuration's label
    GPUDOCTOR_BENCH_OWNER  HOST:PID:START of the campaign process (START = field 22 of /proc/PID/stat, clock ticks
                           since boot), so a reused PID is never mistaken for the owner

A server is *orphaned* when its owner ran on the same machine and that process (PID with that START) is gone. The
process list (gather/procs.py) reads only these keys of a process's environment, never the rest.
"""

from __future__ import annotations

import os
import socket

ENV_RUN, ENV_LABEL, ENV_OWNER = "GPUDOCTOR_BENCH_RUN", "GPUDOCTOR_BENCH_LABEL", "GPUDOCTOR_BENCH_OWNER"
KEYS = (ENV_RUN, ENV_LABEL, ENV_OWNER)
PREFIX = "GPUDOCTOR_BENCH_"


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    try:
        return int(raw.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def owner_token(pid: int | None = None) -> str:
    """HOST:PID:START of this process (the campaign)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{start_ticks(pid) or 0}"


def server_env(run_dir: str, label: str) -> dict[str, str]:
    """The marker environment of a server this campaign starts."""
    return {ENV_RUN: str(run_dir), ENV_LABEL: str(label), ENV_OWNER: owner_token()}


def parse_owner(token: str | None) -> tuple[str, int, int] | None:
    """"host:pid:start" → (host, pid, start); None when malformed."""
    if not token:
        return None
    host, _, rest = token.rpartition(":")
    host, _, pid = host.rpartition(":")
    try:
        return host, int(pid), int(rest)
    except ValueError:
        return None
