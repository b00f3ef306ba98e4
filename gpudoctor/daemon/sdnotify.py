"""sd_notify without a systemd library: one datagram per message to $NOTIFY_SOCKET.

Follows sd_notify(3): the socket is a unix datagram socket path, or an abstract socket when it starts with '@'.
$WATCHDOG_USEC (and $WATCHDOG_PID, when set, must be our pid) says how often systemd wants WATCHDOG=1.
Outside systemd every call is a silent no-op.

The protocol is the main process's alone: `take_protocol_env()` moves systemd's protocol variables out of os.environ
when the daemon starts (what sd_notify(3)'s unset_environment does), so every child — a check's `systemctl
is-enabled`, ssh, a probe — gets an environment without them. That is the one place children's environment loses
them (subprocess and gpudoctor.host.local copy os.environ). A child that inherited NOTIFY_SOCKET would send its own
datagrams there: `systemctl` sends ERRNO=2 for a missing unit, which systemd rejects (and logs) under
NotifyAccess=main, or takes as the service's StatusErrno= under NotifyAccess=all.
"""

from __future__ import annotations

import os
import socket
import threading
import time


# sd_notify(3), sd_watchdog_enabled(3), sd_listen_fds(3), systemd.exec(5) (SYSTEMD_EXEC_PID) and the memory pressure
# protocol (MEMORY_PRESSURE_*): each addressed to the process systemd started, never to its children.
PROTOCOL_VARS = ("NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES",
                 "SYSTEMD_EXEC_PID", "MEMORY_PRESSURE_WATCH", "MEMORY_PRESSURE_WRITE")


def take_protocol_env(environ=None) -> dict:
    """Remove systemd's protocol variables from `environ` (default os.environ, which children inherit) and return
    them, for the Notifier of this process."""
    environ = os.environ if environ is None else environ
    return {k: environ.pop(k) for k in PROTOCOL_VARS if k in environ}


class Notifier:
    """Sends READY=1 / STATUS= / WATCHDOG=1 / RELOADING=1 / STOPPING=1 to systemd."""

    def __init__(self, env: dict | None = None):
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET") or ""
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        self.addr = addr or None
        self.watchdog_s = None
        usec = env.get("WATCHDOG_USEC")
        pid = env.get("WATCHDOG_PID")
        if usec and usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._sock = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.addr is not None

    def notify(self, *fields: str) -> bool:
        """Send one datagram of newline-separated fields; False when not under systemd or the send failed."""
        if not self.addr:
            return False
        msg = "\n".join(fields).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(msg, self.addr)
                return True
            except OSError:
                return False

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []), f"MAINPID={os.getpid()}")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def reloading(self) -> bool:
        mono = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={mono}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class WatchdogPinger:
    """Pings WATCHDOG=1 every half watchdog period unless the main loop is stuck in one step.

    The loop calls `beat()` whenever it makes progress inside a cycle and `idle()` when it goes back to waiting.
    A step that runs past `stall_s` without a beat (a check or remedy hung past every deadline) stops the pings,
    and systemd restarts the daemon — the watchdog's whole point.
    """

    def __init__(self, notifier: Notifier, stall_s: float = 900.0):
        self.notifier = notifier
        self.stall_s = stall_s
        self._last_beat = time.monotonic()
        self._busy = False
        self._stop = threading.Event()
        self._thread = None

    def beat(self) -> None:
        self._last_beat = time.monotonic()
        self._busy = True

    def idle(self) -> None:
        self._last_beat = time.monotonic()
        self._busy = False

    @property
    def stalled(self) -> bool:
        return self._busy and time.monotonic() - self._last_beat > self.stall_s

    def start(self) -> None:
        if not self.notifier.watchdog_s or self._thread is not None:
            return
        period = max(self.notifier.watchdog_s / 2.0, 0.05)

        def run():
            while not self._stop.wait(period):
                if not self.stalled:
                    self.notifier.watchdog()

        self._thread = threading.Thread(target=run, name="gpudoctor-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
