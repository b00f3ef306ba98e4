"""Start, watch and stop an inference server for one campaign configuration, and wait for its GPUs to be free.

`Launcher` is the seam for where the server runs. `LocalLauncher` is a subprocess in its own session (so the whole tree
can be signalled), its stdout and stderr appended to a log file. `gpudoctor.bench.server.remote.HostLauncher` runs it on an
inventory host through `Host.run` (setsid/nohup start, pid and exit status recorded there, process-group stop) and
copies the log back in `sync_log`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Protocol

from gpudoctor.host.base import Host
from gpudoctor.files.atomic import atomic_write
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)


class Launcher(Protocol):
    log_path: str

    def start(self, argv: list[str], env: dict[str, str]) -> int: ...

    def gone(self) -> str | None: ...

    def stop(self, timeout: float) -> None: ...

    def sync_log(self) -> None: ...


class LocalLauncher:
    """The server as a local subprocess in a new session; a pid file lets a resumed campaign stop an orphan."""

    def __init__(self, log_path: str, pid_file: str):
        self.log_path, self.pid_file = log_path, pid_file
        self.proc: subprocess.Popen | None = None

    def start(self, argv: list[str], env: dict[str, str]) -> int:
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== gpudoctor: starting at {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(argv)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env={**os.environ, **env}, start_new_session=True)
            except OSError as exc:
                log.write(f"=== gpudoctor: cannot start {argv[0]}: {exc.strerror}\n".encode())
                raise
        atomic_write(self.pid_file, json.dumps({"pid": self.proc.pid, "argv": argv}))  # whole or absent
        return self.proc.pid

    def gone(self) -> str | None:
        if self.proc is None:
            return "not started"
        rc = self.proc.poll()
        if rc is None:
            return None
        return f"server process exited with rc {rc}" if rc >= 0 else f"server process killed by signal {-rc}"

    def stop(self, timeout: float) -> None:
        if self.proc is not None:
            stop_group(self.proc.pid, timeout, lambda: self.proc.poll() is not None)
            self.proc.wait()
        try:
            fs.fs_unlink(self.pid_file)
        except FileNotFoundError:
            pass

    def sync_log(self) -> None:
        """The log is already local."""


def stop_group(pgid: int, timeout: float, dead) -> None:
    """SIGTERM the process group, SIGKILL it if it is still there after `timeout`."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            if dead():
                return
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def reap_orphan(pid_file: str, timeout: float) -> str | None:
    """Stop a server left by a killed campaign (its pid file survived). Returns what was done, or None."""
    try:
        info = json.loads(Path(pid_file).read_text())
        pid = int(info["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    note = None
    if _group_alive(pid) and _cmdline_matches(pid, info.get("argv") or []):
        stop_group(pid, timeout, lambda: not _group_alive(pid))
        note = f"stopped server left running by an interrupted campaign (pid {pid})"
    fs.fs_unlink(pid_file, missing_ok=True)
    return note


def _cmdline_matches(pid: int, argv: list[str]) -> bool:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] == argv


def port_in_use(host: str, port: int) -> bool:
    """True when something already accepts connections there (we must not benchmark a stranger's server)."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def gpu_busy(host: Host, release_mib: int, timeout: float = 15.0) -> str | None:
    """Why the GPUs are not free yet (compute apps listed, or memory.used above release_mib), or None.

    None also when nvidia-smi is missing: there is nothing to wait for on a machine without NVIDIA GPUs.
    """
    apps = host.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                    timeout=timeout)
    if apps.rc == 127:
        return None
    if apps.timed_out:
        return f"nvidia-smi did not answer in {timeout:g} s"
    rows = [r for r in apps.stdout.splitlines() if r.strip()]
    if apps.rc == 0 and rows:
        return f"{len(rows)} compute process(es) still hold GPU memory: {'; '.join(rows[:4])}"
    mem = host.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"], timeout=timeout)
    if mem.rc != 0:
        return f"nvidia-smi --query-gpu failed: {mem.describe()}"
    busy = []
    for row in mem.stdout.splitlines():
        parts = [p.strip() for p in row.split(",")]
        if len(parts) == 2 and parts[1].isdigit() and int(parts[1]) > release_mib:
            busy.append(f"GPU {parts[0]} {parts[1]} MiB")
    return f"memory still in use (> {release_mib} MiB): {', '.join(busy)}" if busy else None


def wait_gpu_release(host: Host, release_mib: int, deadline_s: float, poll_s: float = 1.0) -> str | None:
    """Poll until the GPUs are free; None when they are, else the last reason after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        why = gpu_busy(host, release_mib)
        if why is None:
            return None
        if time.monotonic() >= end:
            return f"GPUs not released after {deadline_s:g} s: {why}"
        time.sleep(poll_s)
