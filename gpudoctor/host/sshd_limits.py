"""What a node's sshd holds against a client, and how gpudoctor stays clear of it (docs/ssh.md, issue #34).

OpenSSH >= 9.8 penalises a source address (PerSourcePenalties, on by default) for every connection that ends before
login: failed authentication 5 s, an invalid user 5 s, no authentication attempted 1 s (a handshake dropped, an
unknown host key), LoginGraceTime exceeded 10 s, a crash 90 s. Penalties of one address add up; past 15 s the address
is refused — for up to 10 minutes — with "Not allowed at this time" and a close, before any SSH is spoken. A session
that logged in is never penalised however it ends (sshd stops tracking it at login): commands killed at a deadline,
agents ended, connections closed are free. MaxStartups (10:30:100) refuses the same way while too many connections
to one sshd are still before login.

So gpudoctor, per sshd (address and port) and per process:
- at most HANDSHAKES connections to one sshd are before login at once (`handshake`): a fleet of many targets on one
  node never reaches MaxStartups' first threshold; a login is tried alone until it has once succeeded;
- a refused login (authentication failed, host key unknown or changed) is remembered for its endpoint and
  credentials (`LoginKey`): the same login is not tried again until what decides it changes (the identity files,
  the known_hosts files) or RETRY_S pass — a fleet of 50 targets with a wrong key costs one failed login, a daemon
  one per minute (5 s of penalty each, expired long before the next);
- the server's first line is read before paramiko's (`refusal`): a refusal becomes one line naming the penalty and
  the way out (`refused_line`) instead of "Error reading SSH protocol banner".
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

# Connections to one sshd before login at once. MaxStartups starts refusing at 10 by default; and should a key that
# logged in before be refused now (revoked on the node), the most that fail at once are 3 x 5 s = 15 s of penalty,
# not more than PerSourcePenalties' min: the address is never refused for it.
HANDSHAKES = 3
RETRY_S = 60.0  # a refused login is tried again after this long even when nothing changed (authfail costs 5 s)
REFUSAL_TEXT = b"Not allowed at this time"  # what sshd writes before closing (PerSourcePenalties and MaxStartups)

_LOCK = threading.Lock()
_GATES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_REFUSED: dict[tuple, tuple[float, type, str, str]] = {}  # login key -> (monotonic, error class, reason, host name)
_PROVEN: set[tuple] = set()  # login keys that logged in: their handshakes run side by side (up to HANDSHAKES)
_FIRST: dict[tuple, threading.Lock] = {}  # login key -> held by its one attempt while none has succeeded yet


@contextlib.contextmanager
def handshake(key: tuple, name: str):
    """Hold one of HANDSHAKES slots of this sshd (key's address and port) from TCP connect to login or failure. A
    login not yet seen to succeed goes alone: the others with the same key wait for its outcome, so a wrong key is
    tried once, not once per waiting thread (each try is 5 s of penalty: four at once would lock the client out).
    Raises the remembered refusal (`earlier`) instead of trying again."""
    with _LOCK:
        gate = _GATES.setdefault((key[1], key[2]), threading.BoundedSemaphore(HANDSHAKES))
        first = _FIRST.setdefault(key, threading.Lock()) if key not in _PROVEN else None
    if first is not None:
        first.acquire()
    try:
        refused = earlier(key, name)
        if refused is not None:
            raise refused
        if first is not None and key in _PROVEN:  # proven while we waited: go on in parallel
            first.release()
            first = None
        with gate:
            yield
        with _LOCK:
            _PROVEN.add(key)
    finally:
        if first is not None:
            first.release()


def _state(path: str) -> tuple:
    """A file's identity for "did it change": (path, mtime_ns, size), or (path,) when it is absent."""
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_mtime_ns, st.st_size)


def login_key(*, user: str, hostname: str, port: int, identity_files: list[str], known_hosts: list[str],
              allow_agent: bool, look_for_keys: bool, host_key_policy: str) -> tuple:
    """Everything that decides whether a login to this sshd is refused: the same key, the same answer."""
    ids = list(identity_files)
    if look_for_keys:
        ids += [os.path.expanduser(f"~/.ssh/id_{k}") for k in ("rsa", "ecdsa", "ed25519", "dsa")]
    agent = os.environ.get("SSH_AUTH_SOCK", "") if allow_agent else ""
    return (user, hostname, port, tuple(_state(p) for p in ids), tuple(_state(p) for p in known_hosts), agent,
            host_key_policy)


def remember(key: tuple, error: Exception, name: str) -> None:
    """A login refused: later attempts with the same key fail at once (`earlier`) instead of costing a penalty."""
    reason = str(error)
    if name and reason.startswith(f"{name}: "):
        reason = reason[len(name) + 2:]
    with _LOCK:
        _REFUSED[key] = (time.monotonic(), type(error), reason, name)
        _PROVEN.discard(key)


def earlier(key: tuple, name: str) -> Exception | None:
    """The error of an equal login refused less than RETRY_S ago, for host `name`; None: try it."""
    with _LOCK:
        seen = _REFUSED.get(key)
        if seen is None:
            return None
        t, cls, reason, first = seen
        ago = time.monotonic() - t
        if ago >= RETRY_S:
            del _REFUSED[key]
            return None
    by = "" if first == name else f" (for {first})"
    return cls(f"{name}: {reason}; not tried again: the same login was refused {ago:.0f} s ago{by}, and each refused "
               f"login costs this address an sshd penalty (OpenSSH >= 9.8 PerSourcePenalties); it is tried as soon "
               f"as the keys or known_hosts change, else in {RETRY_S - ago:.0f} s")


def forget() -> None:
    """Forget every remembered refusal and success (tests)."""
    with _LOCK:
        _REFUSED.clear()
        _PROVEN.clear()


def refusal(sock: socket.socket, timeout: float) -> bytes | None:
    """Peek at what the server sends first (nothing is consumed: paramiko reads the banner after this). The refusal's
    text when sshd refused this client before SSH ("Not allowed at this time"), b"" when it closed the connection
    without a byte, None when it speaks SSH; TimeoutError when it says nothing within `timeout` (its banner phase)."""
    deadline = time.monotonic() + timeout
    prev = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no SSH banner")
        sock.settimeout(left)
        try:
            data = sock.recv(256, socket.MSG_PEEK)
        except (socket.timeout, TimeoutError):
            raise TimeoutError("no SSH banner") from None
        except OSError:
            return b""  # reset before a byte: refused as well
        finally:
            sock.settimeout(timeout)
        if not data:
            return b""
        if REFUSAL_TEXT in data:
            return REFUSAL_TEXT
        if data.startswith(b"SSH-") or b"\n" in data or len(data) >= 255:
            return None
        if data == prev:  # a partial first line: wait for the rest (the peek does not block while data is queued)
            time.sleep(0.005)
        prev = data


def refused_line(name: str, where: str, text: bytes, client_addr: str | None) -> str:
    """The one line for a refusal before SSH, with the way out."""
    said = f'"{text.decode("ascii", "replace")}"' if text else "no SSH banner, the connection closed"
    addr = client_addr or "this client's address"
    return (f"{name}: {where} refused this client before SSH began ({said}): its sshd penalises {addr} (OpenSSH "
            f">= 9.8 PerSourcePenalties: failed or dropped logins; up to 10 min) or is at MaxStartups; nothing was "
            f"run. Way out: wait for it to expire, or add 'PerSourcePenaltyExemptList {addr}' to the node's sshd_config and "
            f"reload ssh (its log: 'drop connection ... penalty: ...')")
