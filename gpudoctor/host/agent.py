"""Client side of the probe agent (agent_prog.py): one python process per SSH connection runs every probe operation.

SSHHost starts it on the first operation of a connection, over one session channel, and sends it JSON requests
from any number of threads; a reader thread hands each answer to the thread waiting for it. Deadlines stay on
this side: a request that has not been answered in time is abandoned (a command is also killed, process group
and all). The agent is only an optimisation: where it cannot start (a shell that prints before it, a python that
cannot run it), SSHHost falls back to a login shell per command and per file operation (one-shot host/ops.py).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time

from gpudoctor.errors import HostUnreachable
from gpudoctor.host.childpy import python_argv


class AgentUnavailable(Exception):
    """The agent could not start on this connection (the reason is the message); use the classic paths."""


class AgentTimeout(HostUnreachable):
    """The agent did not start in time: the target is slow (a login shell running pyenv/conda init, a loaded
    machine), not unable. Never answered by falling back to a login shell per operation — that multiplies the very
    cost that made it late (a fallback storm): the host is reported with this reason instead."""


class AgentGone(Exception):
    """The agent's channel closed while a request waited. `exited`: the agent process ended on the target (the
    connection may be fine); otherwise the connection itself dropped."""

    def __init__(self, exited: bool, detail: str = ""):
        super().__init__(detail or ("the agent exited" if exited else "connection lost"))
        self.exited = exited


def kill_session(chan) -> None:
    """Ask sshd to SIGKILL a session's process (an SSH "signal" channel request, OpenSSH >= 7.9): a login shell
    still running the target's rc files would otherwise run on after the channel closes. Best effort."""
    try:
        from paramiko.common import cMSG_CHANNEL_REQUEST
        from paramiko.message import Message

        m = Message()
        m.add_byte(cMSG_CHANNEL_REQUEST)
        m.add_int(chan.remote_chanid)
        m.add_string("signal")
        m.add_boolean(False)
        m.add_string("KILL")
        chan.transport._send_user_message(m)
    except Exception:  # noqa: BLE001 - an old server or a dead connection: closing the channel is all that is left
        pass


START_FACTOR = 3  # the agent's start may take this many connect timeouts: a login shell and a python start
EXIT_GRACE = 2.0  # after its stdin's EOF, the agent kills what it runs and exits within this (s), or is killed


def ended(chan) -> bool:
    """The session's process is known to have ended: sshd sent its exit status, or closed the channel itself (it does
    once the process ended; paramiko drops an exit-signal). Only meaningful for a channel not closed on this side."""
    return chan.exit_status != -1 or (chan.closed and chan.transport is not None and chan.transport.is_active())


def source() -> str:
    """The agent program's text (host/ops.py, then agent_prog.py), sent as `python3 -I -S -c SOURCE`."""
    from gpudoctor.host.base import program

    return program("agent")


class _Slot:
    __slots__ = ("event", "answer")

    def __init__(self):
        self.event = threading.Event()
        self.answer: dict | None = None


class Agent:
    """One running agent on one paramiko Transport. Thread-safe."""

    def __init__(self, chan, transport, name: str):
        self.chan = chan
        self.transport = transport
        self.name = name
        self.pid: int | None = None
        self.python: str | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._hello = threading.Event()
        self._settled = threading.Event()  # hello seen, or the channel closed before it
        self._gone = False
        self._exited = False  # once gone: the agent ended on the target (True) or the connection dropped
        self._closing = False
        self._thread = threading.Thread(target=self._read_loop, name=f"gpudoctor-agent-{name}", daemon=True)

    # --- lifecycle ------------------------------------------------------------------------------
    @classmethod
    def start(cls, host, transport) -> "Agent":
        """Start the agent on a new session of `transport` and wait (connect_timeout) for its hello.

        Raises AgentUnavailable when it cannot run there, HostUnreachable when the connection drops meanwhile."""
        import paramiko

        wait = host.connect_timeout * START_FACTOR  # the target's login shell runs first (~/.bashrc: pyenv, conda)
        deadline = time.perf_counter() + wait
        chan = host._open_channel(transport, deadline)
        if chan is None:
            raise AgentTimeout(f"{host.name}: no SSH session opened within {wait:g} s (sshd's MaxSessions, or a "
                               f"loaded target)")
        argv = python_argv(host.python, "-c", source(), site=False)
        try:
            chan.settimeout(max(0.05, deadline - time.perf_counter()))
            chan.exec_command(host.command_line(argv, stdin=True))
            chan.settimeout(2.0)  # the reader loops on timeouts; a send never waits longer for window space
        except (paramiko.SSHException, EOFError, OSError) as exc:
            chan.close()
            if not transport.is_active():
                raise HostUnreachable(f"{host.name}: connection lost while starting the probe agent") from exc
            raise AgentUnavailable(f"could not start: {exc}") from exc
        agent = cls(chan, transport, host.name)
        agent._thread.start()
        agent._settled.wait(max(0.0, deadline - time.perf_counter()))
        if agent._hello.is_set():
            return agent
        if not agent._gone:
            kill_session(chan)  # its login shell is still in ~/.bashrc: do not leave it running on the target
            agent._closing = True  # the reader stops; the channel stays open until the host settles it (its end seen)
            host._keep(chan)
            raise AgentTimeout(f"{host.name}: the probe agent did not start within {wait:g} s (the target's login "
                               f"shell is slow: ~/.bashrc, pyenv/conda init?)")
        if not agent._exited:
            raise HostUnreachable(f"{host.name}: connection lost while starting the probe agent")
        err = _stderr_tail(chan)
        raise AgentUnavailable(f"exited with rc {chan.exit_status}" + (f": {err}" if err else ""))

    @property
    def alive(self) -> bool:
        return not self._gone and not self._closing

    def close(self, grace: float = EXIT_GRACE) -> bool:
        """End the agent: EOF on its stdin (it kills what it runs and exits), up to `grace` s for sshd to report its
        end, then the channel is closed and True returned. Not seen ending: it is killed (an SSH signal) and its channel
        left open for the host to settle (False)."""
        if not self._hello.is_set() and not self._gone:
            kill_session(self.chan)  # not started yet: its login shell is still running the target's rc files
        self._closing = True
        chan = self.chan
        confirmed = ended(chan)
        if not confirmed and not chan.closed and grace > 0:
            try:
                chan.shutdown_write()
                chan.status_event.wait(grace)
            except Exception:  # noqa: BLE001 - a broken channel: the host's settling decides
                pass
            confirmed = ended(chan)
        if confirmed or chan.closed:
            try:
                chan.close()
            except Exception:  # noqa: BLE001 - closing a broken channel may fail; it is gone either way
                pass
        else:
            kill_session(chan)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(2.5)
        return confirmed

    # --- requests -------------------------------------------------------------------------------
    def call(self, req: dict, timeout: float) -> dict | None:
        """Send one request and wait up to `timeout` s for its answer; None when the deadline passed first.

        Raises AgentGone when the channel closed meanwhile."""
        slot = _Slot()
        with self._lock:
            if self._gone or self._closing:
                raise AgentGone(self._exited)
            rid = next(self._ids)
            self._pending[rid] = slot
        try:
            self._send({**req, "id": rid})
            slot.event.wait(max(0.0, timeout))
        finally:
            with self._lock:
                self._pending.pop(rid, None)
        if slot.answer is not None:
            return slot.answer
        if self._gone:
            raise AgentGone(self._exited)
        if req.get("op") == "run":
            self.kill(rid)
        return None

    def kill(self, rid: int) -> None:
        """Kill the process group of request `rid` (a command whose deadline passed)."""
        try:
            self._send({"op": "kill", "target": rid, "id": 0})
        except AgentGone:
            pass

    def _send(self, obj: dict) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        try:
            with self._send_lock:
                self.chan.sendall(data)
        except Exception as exc:  # noqa: BLE001 - OSError, EOFError, socket.timeout, paramiko.SSHException
            self._fail()
            raise AgentGone(self._exited, str(exc)) from exc

    # --- answers --------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        buf = bytearray()
        scan = 0
        try:
            while True:
                try:
                    data = self.chan.recv(1 << 16)
                except socket.timeout:
                    if self._closing:
                        break
                    continue
                if not data:
                    break
                buf += data
                while True:
                    nl = buf.find(b"\n", scan)
                    if nl < 0:
                        scan = len(buf)
                        break
                    line = bytes(buf[:nl])
                    del buf[:nl + 1]
                    scan = 0
                    self._dispatch(line)
        except Exception:  # noqa: BLE001 - a broken transport ends the agent; waiters see AgentGone
            pass
        finally:
            self._fail()

    def _dispatch(self, line: bytes) -> None:
        try:
            obj = json.loads(line)
        except ValueError:
            return  # not ours (a login shell that prints): ignored
        if not isinstance(obj, dict):
            return
        if "hello" in obj and not self._hello.is_set():
            self.pid, self.python = obj.get("pid"), obj.get("python")
            self._hello.set()
            self._settled.set()
            return
        with self._lock:
            slot = self._pending.get(obj.get("id"))
        if slot is not None:
            slot.answer = obj
            slot.event.set()

    def _fail(self) -> None:
        """The channel is closed: decide why, then wake every waiter."""
        if self._gone:
            return
        exited = self._agent_exited()
        with self._lock:
            if self._gone:
                return
            self._exited = exited
            self._gone = True
            waiting = list(self._pending.values())
        self._settled.set()
        for slot in waiting:
            slot.event.set()

    def _agent_exited(self) -> bool:
        """True when the agent process ended on the target while the connection lives on.

        OpenSSH may send the channel's EOF before the exit status, and paramiko closes a dropped connection's
        channels before it marks the transport inactive: wait briefly for either to show."""
        if self._closing:
            return False
        ch = self.chan
        ch.status_event.wait(1.0)
        if ch.exit_status != -1:
            return True
        deadline = time.monotonic() + 0.5
        while self.transport.is_active() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.transport.is_active()


def _stderr_tail(chan) -> str:
    err = b""
    try:
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(1 << 16)
    except Exception:  # noqa: BLE001
        pass
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln and not ln.startswith("gpudoctor-pid:")]
    return lines[-1][:200] if lines else ""
