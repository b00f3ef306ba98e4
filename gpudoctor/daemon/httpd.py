"""A bounded read-only HTTP/1.x server for /metrics and /healthz: one thread, one selector, no thread per socket.

Every connection must deliver its whole request (at most MAX_REQUEST bytes of head) within READ_TIMEOUT_S of being
accepted, and take its answer within WRITE_TIMEOUT_S; then it is closed (one request per connection). At most
MAX_CONNECTIONS are open at once: a new one beyond the cap evicts the oldest connection that has sent nothing (each
looked at first: a request already waiting in its socket is read and answered), else the oldest still sending its
request (an idle or slow client, never one being answered), so a scrape still gets through while a local user holds
hundreds of idle sockets or floods the port with fresh connections. Running out of file descriptors (EMFILE) evicts too, then pauses accepting briefly instead
of spinning on a listener that stays readable. GET and HEAD only; anything else is 405.
"""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_CONNECTIONS = 64
READ_TIMEOUT_S = 5.0
WRITE_TIMEOUT_S = 10.0
MAX_REQUEST = 8192
ACCEPT_BURST = 256  # accepts per wakeup: a flood's backlog drains in few loops, the open connections still get turns
BACKLOG = 4096  # the kernel caps it at net.core.somaxconn: room for a scrape's SYN while a flood fills the queue
ACCEPT_PAUSE_S = 0.1  # after EMFILE with nothing to evict: stop watching the listener this long
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}

# handler(path) -> (status, content type, body)
Handler = Callable[[str], "tuple[int, str, bytes]"]


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    opened: float
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None  # set once the request is read: the answer still to send


@dataclass
class Counters:
    """What the server did since it started (for tests and the debug log)."""

    accepted: int = 0
    answered: int = 0
    timed_out: int = 0
    evicted: int = 0
    refused: int = 0
    accept_errors: int = 0
    loops: int = 0


class BoundedHTTPServer:
    """Serve handler(path) for GET/HEAD on one listening socket, within the bounds in the module docstring."""

    def __init__(self, sock: socket.socket, handler: Handler, *, server_name: str,
                 max_connections: int = MAX_CONNECTIONS, read_timeout: float = READ_TIMEOUT_S,
                 write_timeout: float = WRITE_TIMEOUT_S):
        self.sock = sock
        self.sock.setblocking(False)
        self.handler = handler
        self.server_name = server_name
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.counters = Counters()
        self._conns: dict[socket.socket, _Conn] = {}  # insertion order = accept order: the first is the oldest
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = False
        self._paused_until = 0.0
        self._listening = False
        self._thread: threading.Thread | None = None

    # --- lifecycle -------------------------------------------------------------------------------------------
    def start(self, name: str = "gpudoctor-metrics") -> None:
        self._thread = threading.Thread(target=self.serve, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout)
        for c in list(self._conns.values()):
            self._close(c)
        self._sel.close()
        for s in (self._wake_r, self._wake_w, self.sock):
            s.close()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    # --- the loop --------------------------------------------------------------------------------------------
    def serve(self) -> None:
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._listen(True)
        while not self._stop:
            self.counters.loops += 1
            now = time.monotonic()
            if not self._listening and now >= self._paused_until:
                self._listen(True)
            wait = 0.5
            if self._conns:
                wait = min(wait, max(0.0, min(c.deadline for c in self._conns.values()) - now))
            if not self._listening:
                wait = min(wait, max(0.0, self._paused_until - now))
            for key, mask in self._sel.select(wait):
                if key.fileobj is self._wake_r:
                    self._drain_wake()
                elif key.fileobj is self.sock:
                    self._accept()
                else:
                    c = key.data
                    if c.sock in self._conns:
                        try:
                            (self._write if c.out is not None else self._read)(c)
                        except Exception:  # noqa: BLE001 - one bad connection never ends the server
                            self._close(c)
            self._expire(time.monotonic())

    def _listen(self, on: bool) -> None:
        if on and not self._listening:
            self._sel.register(self.sock, selectors.EVENT_READ, None)
        elif not on and self._listening:
            self._sel.unregister(self.sock)
        self._listening = on

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):  # a burst at a time; the next select comes back for more
            try:
                s, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.counters.accept_errors += 1
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._evict_oldest_waiting():
                        self._listen(False)  # the listener stays readable: do not spin on it
                        self._paused_until = time.monotonic() + ACCEPT_PAUSE_S
                        return
                    continue
                return  # ECONNABORTED and the like: that one is gone
            self.counters.accepted += 1
            s.setblocking(False)
            now = time.monotonic()
            c = _Conn(s, now, now + self.read_timeout)
            if len(self._conns) >= self.max_connections:
                # Full: look at this one first (a flood's client has often hung up already, a scrape has sent its
                # request), so that what has sent nothing goes, not a request that is waiting.
                try:
                    data = s.recv(4096)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    self.counters.refused += 1
                    s.close()
                    continue
                if data:
                    c.buf += data
                if not self._evict_oldest_waiting():
                    self.counters.refused += 1
                    s.close()
                    continue
            self._conns[s] = c
            self._sel.register(s, selectors.EVENT_READ, c)
            if c.buf:
                self._parse(c)

    def _evict_oldest_waiting(self) -> bool:
        """Free one slot: the oldest connection that has sent nothing, else the oldest still sending its request;
        never one being answered. A connection is looked at (one non-blocking read) before it counts as having sent
        nothing: a scrape whose request is waiting in its socket is answered, not evicted (#47: under a flood of
        fresh connections the next burst evicted the scrapes accepted in the last one)."""
        partial = None
        for c in list(self._conns.values()):
            if c.out is not None or c.sock not in self._conns:
                continue
            if not c.buf:
                self._read(c)
                if c.sock not in self._conns:  # answered and done, or gone: a slot is free
                    return True
                if c.out is not None:  # answered, still sending
                    continue
            if not c.buf:
                self.counters.evicted += 1
                self._close(c)
                return True
            if partial is None:
                partial = c
        if partial is not None:
            self.counters.evicted += 1
            self._close(partial)
            return True
        return False

    def _expire(self, now: float) -> None:
        for c in [c for c in self._conns.values() if c.deadline <= now]:
            self.counters.timed_out += 1
            self._close(c)

    def _close(self, c: _Conn) -> None:
        self._conns.pop(c.sock, None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    # --- one connection --------------------------------------------------------------------------------------
    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        if not data:
            self._close(c)
            return
        c.buf += data
        self._parse(c)

    def _parse(self, c: _Conn) -> None:
        """Answer the request in c.buf once its head is whole (or refuse it); until then, wait for more."""
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            end = c.buf.find(b"\n\n")
        if end < 0:
            if len(c.buf) > MAX_REQUEST:
                self._answer(c, 431, "text/plain", b"request head too large\n", head_only=False)
            return
        if end > MAX_REQUEST:
            self._answer(c, 431, "text/plain", b"request head too large\n", head_only=False)
            return
        line = bytes(c.buf[:c.buf.find(b"\n")]).decode("latin-1").strip()
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._answer(c, 400, "text/plain", b"bad request\n", head_only=False)
            return
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            self._answer(c, 405, "text/plain", b"read-only: GET /metrics or /healthz\n", head_only=False,
                         extra=("Allow: GET, HEAD",))
            return
        try:
            code, ctype, body = self.handler(target.split("?", 1)[0])
        except Exception:  # noqa: BLE001 - a failing handler is a 500, never a dead server
            code, ctype, body = 500, "text/plain", b"internal error\n"
        self._answer(c, code, ctype, body, head_only=method == "HEAD")

    def _answer(self, c: _Conn, code: int, ctype: str, body: bytes, *, head_only: bool, extra=()) -> None:
        head = [f"HTTP/1.1 {code} {REASONS.get(code, 'Unknown')}", f"Server: {self.server_name}",
                f"Content-Type: {ctype}", f"Content-Length: {len(body)}", "Connection: close", *extra, "", ""]
        c.out = memoryview("\r\n".join(head).encode("latin-1") + (b"" if head_only else body))
        c.deadline = time.monotonic() + self.write_timeout
        self.counters.answered += 1
        self._write(c)
        if c.sock in self._conns and c.out is not None:
            self._sel.modify(c.sock, selectors.EVENT_WRITE, c)

    def _write(self, c: _Conn) -> None:
        try:
            n = c.sock.send(c.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        c.out = c.out[n:]
        if not len(c.out):
            try:
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._close(c)


def listen(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on host:port (IPv6 when host has a colon); OSError when it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(backlog)
    except OSError:
        s.close()
        raise
    return s
