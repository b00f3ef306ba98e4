"""Processes the tests started themselves (never the machine's others: many test runs share a machine)."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def stop(proc, grace: float = 10.0) -> None:
    """A child we started ends: SIGTERM, then SIGKILL after `grace` seconds; reaped either way."""
    import signal
    import subprocess

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)
