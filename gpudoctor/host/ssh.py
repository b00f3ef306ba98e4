"""The SSH backend: one paramiko connection per host, shared by every thread; strict host keys by default.

Commands and file operations go through one probe agent per connection (host/agent.py: a python process started
once, so a check costs one login shell on the target, not one per command); the file operations are host/ops.py's,
the same code LocalHost runs in process. Where the agent cannot run, and for commands with input: commands run as
`exec ARGV` under the remote login shell, every argument quoted by base.quote_argv (the one place), and a file
operation runs one-shot (Host._call: host/ops.py as `python -I -S -c`, a login shell per request).
A transport failure raises HostUnreachable, an unknown or changed host key raises HostKeyError before any
command runs, a command's deadline passing is a result with timed_out=True and its process group is killed.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import getpass
import hashlib
import os
import re
import secrets
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field

from gpudoctor.errors import HostError, HostKeyError, HostUnreachable, LoginRefused
from gpudoctor.host.base import CommandResult, Host, quote_argv

HOST_KEY_POLICIES = ("strict", "accept-new")
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_PID_MARK = re.compile(rb"gpudoctor-pid:(\d+)\n")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
AGENT_KILL_GRACE = 2.0  # the agent kills a command itself this long after its deadline (a client that went away)


_OPEN: "weakref.WeakValueDictionary[int, SSHHost]" = weakref.WeakValueDictionary()  # id -> host (not hashable)


_HURRY_UNTIL: float | None = None  # hurry(): every close and settle from now on ends by then


def hurry(seconds: float) -> None:
    """The run was interrupted (Ctrl-C): whatever closes or settles connections from now on is done within `seconds`
    in all (each agent still gets EOF and kills what it runs; sessions not seen ending by then are left to sshd).
    The CLI calls it from its SIGINT handler, before any cleanup starts (docs/cli.md: every command stops within 1 s)."""
    global _HURRY_UNTIL
    until = time.monotonic() + seconds
    _HURRY_UNTIL = until if _HURRY_UNTIL is None else min(_HURRY_UNTIL, until)


def _hurried(limit: float | None) -> float | None:
    """`limit` seconds from now, or less when hurry() was called."""
    if _HURRY_UNTIL is None:
        return limit
    left = max(0.0, _HURRY_UNTIL - time.monotonic())
    return left if limit is None else min(limit, left)


def close_all(wait: float = 1.0, settle: float | None = None) -> None:
    """Close every SSH connection of this process (the end of a fleet run, an interrupted run): each agent sees EOF and
    kills what it runs; a session still in the target's rc files is awaited or reaped (SSHHost._settle). Hosts are
    closed in parallel; a host whose connection is busy longer than `wait` is skipped; `settle`: at most that many
    seconds in all (None: each host's own settle time); after hurry(), at most what is left of its time."""
    def one(host):
        if host._lock.acquire(timeout=_hurried(wait) if _HURRY_UNTIL is None else min(wait, 0.1)):
            try:
                host._drop_locked(final=True)
            finally:
                host._lock.release()

    _parallel(one, list(_OPEN.values()), settle)
    if not _DEFER:
        settle_deferred(settle)


_DEFER = 0  # inside deferred_settle(): a closing host leaves its unsettled sessions to the end of the block
_DEFER_LOCK = threading.Lock()
_UNSETTLED: list = []  # (host, client, kept channels, reap needed): settled by settle_deferred


@contextlib.contextmanager
def deferred_settle(settle: float | None = None):
    """A fleet run: a host's close does not wait for its late sessions (a login shell still in slow rc files) to end —
    that would hold its worker and the hosts queued behind it; they are settled together, in parallel, when the
    block ends (and nothing gpudoctor started is left on any target then)."""
    global _DEFER
    with _DEFER_LOCK:
        _DEFER += 1
    try:
        yield
    finally:
        with _DEFER_LOCK:
            _DEFER -= 1
            last = _DEFER == 0
        if last:
            settle_deferred(settle)


def settle_deferred(settle: float | None = None) -> None:
    """Settle every deferred connection (in parallel), then close it."""
    with _DEFER_LOCK:
        work, _UNSETTLED[:] = list(_UNSETTLED), []

    def one(item):
        host, client, pending, reap = item
        try:
            host._settle(client, pending, reap)
        finally:
            try:
                if client is not None:
                    client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail; it is gone either way
                pass

    _parallel(one, work, settle)


def _parallel(fn, items, limit: float | None) -> None:
    threads = [threading.Thread(target=fn, args=(x,), name="gpudoctor-ssh-close", daemon=True) for x in items]
    for t in threads:
        t.start()
    limit = _hurried(limit)
    deadline = None if limit is None else time.monotonic() + limit
    for t in threads:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


def fingerprint(key) -> str:
    """OpenSSH's SHA256 fingerprint of a paramiko key: `SHA256:base64-without-padding`."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_label(hostname: str, port: int) -> str:
    """The name OpenSSH files a host key under: `host`, or `[host]:port` off port 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


@dataclass
class _Resolved:
    hostname: str
    port: int
    user: str
    identity_files: list[str]
    known_hosts: str
    proxy_command: str | None


@dataclass(eq=False)
class SSHHost(Host):
    """A target reached over SSH. Built lazily: nothing connects until the first operation."""

    name: str = ""
    address: str = ""  # host name, IP address or an alias of ~/.ssh/config
    port: int | None = None  # None: ~/.ssh/config's Port, else 22
    user: str | None = None  # None: ~/.ssh/config's User, else the local user
    identity_files: list[str] = field(default_factory=list)  # tried before ~/.ssh/config's IdentityFile
    known_hosts: str | None = None  # None: ~/.ssh/config's UserKnownHostsFile, else ~/.ssh/known_hosts
    host_key_policy: str = "strict"  # "accept-new": trust and record an unknown key (never a changed one)
    connect_timeout: float = 10.0  # deadline of each connect phase: TCP, banner, key exchange, auth
    ssh_config: str | None = None  # None: ~/.ssh/config when it exists; "": read none
    # How the ssh config's text is read: target.py passes files/inputs.py's read_config (the one door: as root, a
    # config another user can change is refused, since its ProxyCommand would run as root). None (library use,
    # tests): paramiko reads the file itself.
    read_config: object = None
    allow_agent: bool = True
    look_for_keys: bool | None = None  # None: try ~/.ssh/id_* only when no identity file is known
    max_sessions: int = 8  # concurrent commands per connection (sshd's MaxSessions defaults to 10; the agent holds one)
    agent: bool = True  # probes through one agent process per connection (False: a login shell per request)
    python: list[str] = field(default_factory=lambda: ["python3"])
    root: str = ""  # tests/labs: prefix of every absolute path of a file operation (like LocalHost.root)
    path_prepend: list[str] = field(default_factory=list)  # tests/labs: directories put first on the remote PATH

    def __post_init__(self):
        if self.host_key_policy not in HOST_KEY_POLICIES:
            raise ValueError(f"host_key_policy must be one of {HOST_KEY_POLICIES}, not {self.host_key_policy!r}")
        self.name = self.name or self.address
        self._lock = threading.Lock()  # guards the connection
        self._sessions = threading.BoundedSemaphore(max(1, self.max_sessions))
        self._client = None
        self._attempts = 0
        self._last_error: HostError | None = None
        self._resolved: _Resolved | None = None
        self._agent = None  # gpudoctor.host.agent.Agent of the current connection
        self._agent_lock = threading.Lock()
        self._agent_off = None  # the transport on which the agent could not start (then: classic paths)
        self._agent_late = None  # (transport, AgentTimeout): it started too slowly there; every op reports that
        self.agents_started = 0
        self.connections_made = 0
        # Every session this host opens carries GPUDOCTOR_RUN=<nonce> (its command line, then the environment of all
        # it starts): what the reaper finds and kills on the target when a session's end was not seen (#28).
        self._nonce = secrets.token_hex(8)
        self._pending_lock = threading.Lock()
        self._pending: list = []  # channels whose process end was not seen yet, left open (sshd can still signal it)
        self._reap_needed = False  # a session closed before its end was seen: scan the target for the nonce
        self.reaped: list[int] = []  # processes the reaper killed (logged; the tests read it)
        self.reap_connections = 0  # connections opened only to reap (the one the sessions ran on was gone)
        _OPEN[id(self)] = self

    # --- connection ---------------------------------------------------------------------------
    def _path(self, path: str) -> str:
        return self.root + path if self.root and path.startswith("/") else path

    def resolve(self) -> _Resolved:
        """Merge explicit settings over ~/.ssh/config (explicit wins, as on the ssh command line)."""
        import paramiko

        cfg: dict = {}
        path = self.ssh_config if self.ssh_config is not None else os.path.expanduser("~/.ssh/config")
        text = self.read_config(path) if path and self.read_config is not None else None
        if text is not None or (path and self.read_config is None and os.path.exists(path)):
            try:
                conf = paramiko.SSHConfig.from_text(text) if text is not None else paramiko.SSHConfig.from_path(path)
                cfg = dict(conf.lookup(self.address))
            except Exception as exc:  # noqa: BLE001 - any parse problem becomes one clear line
                raise HostUnreachable(f"{self.name}: cannot use ssh config {path}: {exc}") from exc
        hostname = cfg.get("hostname") or self.address
        port = self.port if self.port is not None else int(cfg.get("port", 22))
        user = self.user or cfg.get("user") or getpass.getuser()
        ids = [os.path.expanduser(p) for p in self.identity_files]
        ids += [p for p in (os.path.expanduser(p) for p in cfg.get("identityfile", [])) if os.path.exists(p)]
        kh = self.known_hosts or (cfg.get("userknownhostsfile") or "").split(" ")[0] or "~/.ssh/known_hosts"
        proxy = cfg.get("proxycommand") or None
        return _Resolved(hostname, port, user, ids, os.path.expanduser(kh), proxy)

    def _where(self, r: _Resolved) -> str:
        return f"{r.user}@{r.hostname}:{r.port}"

    def _transport(self):
        """The live paramiko Transport, connecting (once, for all threads) when there is none."""
        seen = self._attempts
        with self._lock:
            if self._client is not None:
                t = self._client.get_transport()
                if t is not None and t.is_active():
                    return t
                self._drop_locked()
            if self._attempts != seen and self._last_error is not None:
                raise self._last_error  # another thread failed while we waited: do not hammer the host
            self._attempts += 1
            try:
                self._client = self._connect()
                self._last_error = None
            except HostError as exc:
                self._last_error = exc
                raise
            return self._client.get_transport()

    def _connect(self):
        """Connect and log in, the way a node's sshd never penalises (host/sshd_limits.py): a login refused before
        with the same keys is not tried again at once, and at most HANDSHAKES connections to one sshd are before
        login at the same time."""
        from gpudoctor.host import sshd_limits

        _quiet_paramiko()
        r = self._resolved = self.resolve()
        where = self._where(r)
        log = _log(host=self.name, target=where)
        for p in self.identity_files:
            if not os.path.exists(os.path.expanduser(p)):
                raise HostUnreachable(f"{self.name}: identity file {p} does not exist")
            if os.path.isdir(os.path.expanduser(p)):
                raise HostUnreachable(f"{self.name}: identity file {p} is a directory, not a key file")
        look = self.look_for_keys if self.look_for_keys is not None else not r.identity_files
        key = sshd_limits.login_key(user=r.user, hostname=r.hostname, port=r.port, identity_files=r.identity_files,
                                    known_hosts=[GLOBAL_KNOWN_HOSTS, r.known_hosts], allow_agent=self.allow_agent,
                                    look_for_keys=look, host_key_policy=self.host_key_policy)
        with sshd_limits.handshake(key, self.name):  # raises an equal login's refusal instead of trying again
            try:
                return self._login(r, where, look, log)
            except (HostKeyError, LoginRefused) as exc:
                sshd_limits.remember(key, exc, self.name)
                raise

    def _login(self, r: _Resolved, where: str, look: bool, log):
        import paramiko

        client = paramiko.SSHClient()
        files = [f for f in (GLOBAL_KNOWN_HOSTS, r.known_hosts) if os.path.exists(f)]
        for f in files:
            try:
                client.load_system_host_keys(f)
            except Exception as exc:  # noqa: BLE001
                raise HostKeyError(f"{self.name}: cannot read known_hosts file {f}: {exc}; nothing was run") from exc
        label = known_hosts_label(r.hostname, r.port)
        client.set_missing_host_key_policy(_policy(self, r, label, files))
        local = None  # this end's address, as the node's sshd sees it (direct connections only)
        if r.proxy_command:
            try:
                sock = paramiko.ProxyCommand(r.proxy_command)
            except Exception as exc:  # noqa: BLE001
                raise HostUnreachable(f"{self.name}: ProxyCommand {r.proxy_command!r} failed: {exc}") from exc
        else:
            sock = self._dial(r, where)
            local = _local_addr(sock)
            self._refused_before_ssh(sock, where, local)
        t0 = time.perf_counter()
        log.debug("ssh.connect")
        try:
            client.connect(r.hostname, port=r.port, username=r.user, key_filename=r.identity_files or None,
                           allow_agent=self.allow_agent, look_for_keys=look, timeout=self.connect_timeout,
                           banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                           channel_timeout=self.connect_timeout, sock=sock)
        except HostError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(_changed_key_message(self.name, label, exc.key, exc.expected_key, files)) from exc
        except paramiko.PasswordRequiredException as exc:
            client.close()
            raise HostUnreachable(f"{self.name}: an identity file for {where} is passphrase-protected; load it into "
                                  f"ssh-agent (ssh-add FILE) and try again") from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            tried = ", ".join(r.identity_files) or "none"
            agent = "yes" if self.allow_agent and os.environ.get("SSH_AUTH_SOCK") else "no"
            raise LoginRefused(f"{self.name}: authentication failed for {where} (identity files: {tried}; "
                               f"ssh-agent: {agent})") from exc
        except (socket.timeout, TimeoutError) as exc:
            client.close()
            raise HostUnreachable(f"{self.name}: no answer from {where} within {self.connect_timeout:g} s") from exc
        except socket.gaierror as exc:
            client.close()
            raise HostUnreachable(f"{self.name}: cannot resolve host name {r.hostname!r}: {exc.strerror}") from exc
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            client.close()
            raise HostUnreachable(f"{self.name}: connection to {where} refused") from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            detail = str(exc) or type(exc).__name__
            if detail.startswith("Error reading SSH protocol banner"):
                # paramiko's words for a close before the banner (EOF, a reset): a refusal, said as one (a proxied
                # connection, or a close after sshd_limits.refusal's peek); for a timeout they add "timed out"
                if "timed out" in detail:
                    raise HostUnreachable(f"{self.name}: no SSH banner from {where} within "
                                          f"{self.connect_timeout:g} s") from exc
                from gpudoctor.host.sshd_limits import refused_line

                raise HostUnreachable(refused_line(self.name, where, b"", local)) from exc
            raise HostUnreachable(f"{self.name}: SSH to {where} failed: {detail}") from exc
        t = client.get_transport()
        t.set_keepalive(30)
        if isinstance(t.sock, socket.socket):  # small request/answer packets: do not wait for delayed ACKs
            t.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections_made += 1
        log.info("ssh.connected", seconds=round(time.perf_counter() - t0, 3))
        return client

    def _dial(self, r: _Resolved, where: str) -> socket.socket:
        """The TCP connection, with TCP_NODELAY from its first byte: the key exchange and authentication are small
        packets answered one by one, and with Nagle each waited on a delayed ACK (~40 ms per connection)."""
        try:
            infos = socket.getaddrinfo(r.hostname, r.port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise HostUnreachable(f"{self.name}: cannot resolve host name {r.hostname!r}: {exc.strerror}") from exc
        refused: OSError | None = None
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self.connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.connect(addr)
                return sock
            except (socket.timeout, TimeoutError) as exc:
                sock.close()
                raise HostUnreachable(f"{self.name}: no answer from {where} within {self.connect_timeout:g} s") from exc
            except OSError as exc:
                sock.close()
                if exc.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):  # as paramiko: try the next address
                    raise HostUnreachable(f"{self.name}: SSH to {where} failed: {exc.strerror or exc}") from exc
                refused = exc
        raise HostUnreachable(f"{self.name}: connection to {where} refused") from refused

    def _refused_before_ssh(self, sock: socket.socket, where: str, local: str | None) -> None:
        """sshd refuses a penalised client (and one over MaxStartups) with a line of text and a close, before SSH:
        read it first, so the user gets one line naming it and the way out, not "Error reading SSH protocol banner"."""
        from gpudoctor.host.sshd_limits import refusal, refused_line

        try:
            text = refusal(sock, self.connect_timeout)
        except TimeoutError as exc:
            sock.close()
            raise HostUnreachable(f"{self.name}: no SSH banner from {where} within {self.connect_timeout:g} s") from exc
        if text is not None:
            sock.close()
            line = refused_line(self.name, where, text, local)
            _log(host=self.name, target=where).info("ssh.refused_before_ssh", text=text.decode("ascii", "replace"))
            raise HostUnreachable(line)

    def _keep(self, chan) -> None:
        """A session whose end was not seen: kept open until the host settles it (host/agent.py, run)."""
        with self._pending_lock:
            self._pending.append(chan)

    def _drop_locked(self, final: bool = False) -> None:
        """Drop the connection. Its sessions not seen ending are settled (_settle) over it while it lives; over a dead
        one (a dropped connection about to be rebuilt) they are reaped over the next connection when the host closes
        (`final`), or over a fresh one then if none is left."""
        agent = self._agent
        if agent is not None:
            if not agent.close():
                self._keep(agent.chan)
            self._agent = None
        client, self._client = self._client, None
        with self._pending_lock:
            pending, self._pending = self._pending, []
        t = client.get_transport() if client is not None else None
        if pending and not (t is not None and t.is_active()):
            self._reap_needed = True  # the connection is gone: what it ran cannot be asked about over it
            for c in pending:
                c.close()
            pending = []
            if not final:
                client.close()
                return
        reap = self._reap_needed and final
        if reap:
            self._reap_needed = False
        if (client is not None or reap) and (pending or reap):
            with _DEFER_LOCK:
                if _DEFER:
                    _UNSETTLED.append((self, client, pending, reap))
                    return
            self._settle(client, pending, reap)
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail; it is gone either way
                pass

    SETTLE_S = 60.0  # how long (at least) a closing host waits for its kept sessions to end before reaping them

    def _settle(self, client, pending: list, reap_needed: bool) -> None:
        """Make sure nothing this host started on the target outlives it. Every kept session (an agent that started
        late, one that did not exit at EOF) gets EOF on its stdin and an SSH kill signal (sshd refuses it for root
        logins), and sshd's report of its end is awaited: a login shell still in slow rc files goes on to exec the
        agent, which reads the EOF and exits. What is not seen ending within the settle time (max(SETTLE_S,
        6 x connect_timeout)), and any session closed before its end was seen, is reaped over a fresh channel."""
        from gpudoctor.host.agent import ended, kill_session

        t = client.get_transport() if client is not None else None
        live = t is not None and t.is_active()
        open_ = [c for c in pending if not (live and ended(c))]
        if live and open_:
            for c in open_:
                kill_session(c)
                try:
                    c.shutdown_write()
                except Exception:  # noqa: BLE001 - a broken channel: the reaper decides
                    pass
            deadline = time.monotonic() + _hurried(max(self.SETTLE_S, 6 * self.connect_timeout))
            for c in open_:
                while not ended(c) and t.is_active() and time.monotonic() < deadline:
                    c.status_event.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            open_ = [c for c in open_ if not ended(c)]
            _log(host=self.name).info("ssh.settled", kept=len(pending), not_ended=len(open_))
        for c in pending:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - a broken channel: the reaper decides
                pass
        if open_ or reap_needed:
            self._reap(t if live and t.is_active() else None)

    REAP_TRIES = 40  # scans (50 ms apart) before the reaper gives up on a process that does not die

    def reap_line(self) -> str:
        """The shell line that kills, on the target, every process carrying this host's nonce in its command line (a
        login shell still in its rc files, before it printed its PID) or its environment (what an exec'd command
        started), process group and all, and scans again until none is left. Its own command line holds the pattern
        as a bracket expression, so it never matches itself. Prints gpudoctor-reaped:SCANS:PIDS."""
        n = self._nonce
        pat = f"GPUDOCTOR_RUN={n[:-1]}[{n[-1]}]"
        return ("i=0; all=; while [ $i -lt %d ]; do "
                "l=$(grep -lsa -e '%s' /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null "
                "| sed -n 's#^/proc/\\([0-9]*\\)/.*#\\1#p' | sort -u); "
                "[ -z \"$l\" ] && break; for p in $l; do kill -s KILL -- \"-$p\" \"$p\" 2>/dev/null; done; "
                "all=\"$all $l\"; i=$((i+1)); sleep 0.05; done; echo \"gpudoctor-reaped:$i:$all\""
                % (self.REAP_TRIES, pat))

    def _reap(self, transport) -> None:
        """Run reap_line over a fresh channel (a new connection when this one is gone); log what it killed."""
        import paramiko

        from gpudoctor.host.agent import START_FACTOR, kill_session

        log = _log(host=self.name)
        client = None
        try:
            if transport is None:
                client = self._connect()
                self.connections_made -= 1  # not one that served an operation
                self.reap_connections += 1
                transport = client.get_transport()
            wait = max(30.0, self.connect_timeout * START_FACTOR * 2)  # a login shell on a loaded target
            chan = self._open_channel(transport, time.perf_counter() + wait)
            if chan is None:
                log.warning("ssh.reap.no_session")
                return
            try:
                chan.settimeout(wait)
                chan.exec_command(self.reap_line())
                out, _err, finished = self._collect(chan, time.perf_counter() + wait)
                if not finished:
                    kill_session(chan)
                    log.warning("ssh.reap.timeout", seconds=wait)
                    return
            finally:
                chan.close()
            m = re.search(rb"gpudoctor-reaped:(\d+):([\d\s]*)", bytes(out))
            if not m:
                log.warning("ssh.reap.no_answer")
                return
            pids = sorted({int(x) for x in m.group(2).split()})
            self.reaped += pids
            if int(m.group(1)) >= self.REAP_TRIES:
                log.warning("ssh.reap.survivors", pids=pids[:20])
            elif pids:
                log.info("ssh.reap.killed", pids=pids[:20], count=len(pids))
        except (HostError, paramiko.SSHException, EOFError, OSError) as exc:
            log.warning("ssh.reap.failed", reason=_why(exc))
        finally:
            if client is not None:
                client.close()

    def connect(self) -> None:
        """Connect now (host key checked, user authenticated) without running anything; HostKeyError or
        HostUnreachable when that fails. Callers that talk to several hosts connect to all of them first, so an
        unknown host key stops the whole run before any command runs anywhere."""
        self._transport()

    def close(self) -> None:
        """Close the connection; a later operation reconnects."""
        with self._lock:
            self._drop_locked(final=True)

    @property
    def connected(self) -> bool:
        c = self._client
        t = c.get_transport() if c is not None else None
        return bool(t is not None and t.is_active())

    # --- commands -----------------------------------------------------------------------------
    def command_line(self, argv: list[str], env: dict[str, str] | None = None, stdin: bool = False) -> str:
        """The exact shell line sent to the target. Every argument passes through quote_argv.

        Without input, stdin is /dev/null on the target (as LocalHost's DEVNULL) so no EOF has to be sent:
        paramiko sends a channel EOF outside its lock, and one racing the server's close of a finished
        command reaches the server after the channel is freed; OpenSSH then drops the whole connection.
        """
        argv = _checked(argv, env)
        if env:
            argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
        parts = [f"GPUDOCTOR_RUN={self._nonce}; export GPUDOCTOR_RUN", 'echo "gpudoctor-pid:$$" >&2']
        if self.path_prepend:
            parts.append("PATH=" + quote_argv([":".join(self.path_prepend)]) + ':"$PATH"; export PATH')
        parts.append("exec " + quote_argv(argv) + ("" if stdin else " </dev/null"))
        return "; ".join(parts)

    def run(self, argv, timeout=None, input=None, env=None) -> CommandResult:
        import paramiko

        timeout = self.default_timeout if timeout is None else timeout
        argv = _checked(argv, env)  # bad input is refused before anything connects
        if input is None:
            agent = self._agent_for()
            if agent is not None:
                return self._run_agent(agent, argv, timeout, env)
        line = self.command_line(argv, env, stdin=input is not None)
        transport = self._transport()  # connecting has its own deadline; the command's starts now
        t0 = time.perf_counter()
        deadline = t0 + timeout
        if not self._sessions.acquire(timeout=max(0.0, deadline - time.perf_counter())):
            return CommandResult(argv, None, "", f"no free SSH session on {self.name} within {timeout:g} s",
                                 time.perf_counter() - t0, timed_out=True, timeout_s=timeout)
        pid = None
        try:
            chan = self._open_channel(transport, deadline)
            if chan is None:
                return CommandResult(argv, None, "", "", time.perf_counter() - t0, timed_out=True, timeout_s=timeout)
            try:
                chan.settimeout(max(0.05, deadline - time.perf_counter()))
                chan.exec_command(line)
                if input is not None:
                    if input:
                        chan.sendall(input)
                    if not chan.exit_status_ready():  # narrows paramiko's EOF-after-close race (see command_line)
                        chan.shutdown_write()
                out, err, finished = self._collect(chan, deadline)
            except socket.timeout:
                out, err, finished = bytearray(), bytearray(), False
            finally:
                if not chan.closed:
                    if not chan.exit_status_ready():  # timed out: its end is not seen; the host reaps at close
                        from gpudoctor.host.agent import kill_session

                        kill_session(chan)
                        self._reap_needed = True
                    chan.close()
            m = _PID_MARK.search(bytes(err))
            if m:
                pid = int(m.group(1))
                del err[m.start():m.end()]
            if not finished:
                timed_out = True
            else:
                timed_out = False
                rc = chan.recv_exit_status() if chan.exit_status_ready() else None
                if rc is None or (rc == -1 and not transport.is_active()):
                    raise HostUnreachable(f"{self.name}: connection lost while running {_shown(argv)}")
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise HostUnreachable(f"{self.name}: connection lost while running {_shown(argv)}: {_why(exc)}") from exc
        finally:
            self._sessions.release()
        if timed_out:
            self._kill_group(pid)
            _log(host=self.name).info("ssh.command.timeout", argv=argv[:4], timeout_s=timeout)
            return CommandResult(argv, None, "", "", time.perf_counter() - t0, timed_out=True, timeout_s=timeout)
        return CommandResult(argv, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                             time.perf_counter() - t0, timeout_s=timeout)

    def _open_channel(self, transport, deadline: float):
        """A new session channel. A refusal (the server at its MaxSessions while closed sessions wind down)
        is retried until the deadline; paramiko reports it as ChannelException, or, when another thread's
        refusal raced for the same saved exception, as a bare SSHException on a live transport."""
        import paramiko

        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            try:
                return transport.open_session(timeout=min(left, self.connect_timeout))
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if not transport.is_active():  # paramiko re-raises the dead transport's own error (EOFError...)
                    raise HostUnreachable(f"{self.name}: connection lost: {_why(exc)}") from exc
                time.sleep(0.02)

    @staticmethod
    def _collect(chan, deadline: float):
        """Read stdout and stderr together until the command exits or the deadline passes."""
        import select

        out, err = bytearray(), bytearray()
        while True:
            busy = False
            while chan.recv_ready():
                out += chan.recv(65536)
                busy = True
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                busy = True
            if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                return out, err, True
            if chan.closed:
                return out, err, True  # closed without an exit status: the caller decides what it means
            if busy:
                continue
            left = deadline - time.perf_counter()
            if left <= 0:
                return out, err, False
            if chan.eof_received:
                chan.status_event.wait(min(left, 0.5))
            else:
                select.select([chan], [], [], min(left, 0.5))

    def _kill_group(self, pid: int | None) -> None:
        """Kill the timed-out command's process group (sshd made it a session leader) on the target."""
        if not pid:
            return
        try:
            self.run(["sh", "-c", 'kill -9 -"$1"', "sh", str(int(pid))], timeout=min(5.0, self.connect_timeout))
        except HostError:
            pass  # the connection is gone: nothing more can be done from here

    # --- the probe agent (host/agent.py): every probe op of a connection in one process on the target ------
    def _agent_for(self):
        """The running agent of the current connection, started on its first use; None where it cannot run
        (no python there...): the caller then takes the classic path (a login shell per command, SFTP)."""
        if not self.agent:
            return None
        transport = self._transport()
        with self._agent_lock:
            a = self._agent
            if a is not None and a.transport is transport and a.alive:
                return a
            if self._agent_off is transport:
                return None
            late = self._agent_late
            if late is not None and late[0] is transport:
                raise late[1]  # it was too slow once on this connection: not a new login shell per operation
            from gpudoctor.host.agent import Agent, AgentTimeout, AgentUnavailable

            if a is not None:
                if not a.close():
                    self._keep(a.chan)
                self._agent = None
            try:
                a = Agent.start(self, transport)
            except AgentTimeout as exc:
                self._agent_late = (transport, exc)
                _log(host=self.name).warning("ssh.agent.timeout", reason=str(exc))
                raise
            except AgentUnavailable as exc:
                self._agent_off = transport
                _log(host=self.name).info("ssh.agent.unavailable", reason=str(exc))
                return None
            self._agent = a
            self.agents_started += 1
            return a

    def _call(self, req: dict, timeout: float) -> dict | None:
        """A host/ops.py request through the agent; one-shot (Host._call) where the agent cannot serve it."""
        from gpudoctor.host.agent import AgentGone

        a = self._agent_for()
        if a is None:
            return Host._call(self, req, timeout)
        write = req.get("op") not in ("read", "stat", "open", "listdir", "statvfs", "batch")
        try:
            ans = a.call(req, timeout)
        except AgentGone as exc:
            if not exc.exited:
                raise HostUnreachable(f"{self.name}: connection lost during {req.get('op')}") from exc
            _log(host=self.name).warning("ssh.agent.exited", op=req.get("op"))
            if write:  # it may have happened: never done twice
                return {"errno": errno.EIO, "msg": f"the probe agent on {self.name} ended during the operation"}
            return Host._call(self, req, timeout)  # reads are safe to ask again
        if ans is not None and "bad" in ans and not write:
            _log(host=self.name).warning("ssh.agent.bad_answer", op=req.get("op"), error=ans["bad"])
            return Host._call(self, req, timeout)
        return ans

    def _run_agent(self, agent, argv: list[str], timeout: float, env) -> CommandResult:
        from gpudoctor.host.agent import AgentGone

        req = {"op": "run", "argv": argv, "timeout": timeout + AGENT_KILL_GRACE, "env": env or None,
               "path_prepend": list(self.path_prepend) or None}
        py = [str(x) for x in self.python]
        if py and argv[:len(py)] == py:
            req["py"] = len(py)  # the agent runs it with the interpreter it already resolved
        t0 = time.perf_counter()
        try:
            ans = agent.call(req, timeout)
        except AgentGone as exc:
            if not exc.exited:
                raise HostUnreachable(f"{self.name}: connection lost while running {_shown(argv)}") from exc
            return CommandResult(argv, None, "", f"the probe agent on {self.name} ended while the command ran",
                                 time.perf_counter() - t0, timeout_s=timeout)  # never run twice: it may not be idempotent
        dur = time.perf_counter() - t0
        if ans is None or ans.get("t"):
            _log(host=self.name).info("ssh.command.timeout", argv=argv[:4], timeout_s=timeout)
            return CommandResult(argv, None, "", "", dur, timed_out=True, timeout_s=timeout)
        if "bad" in ans:
            return CommandResult(argv, None, "", f"probe agent: {ans['bad']}", dur, timeout_s=timeout)
        return CommandResult(argv, ans["rc"], base64.b64decode(ans["o"]).decode("utf-8", "replace"),
                             base64.b64decode(ans["e"]).decode("utf-8", "replace"), dur, timeout_s=timeout)


def _checked(argv: list[str], env: dict[str, str] | None) -> list[str]:
    """argv as strings; ValueError for what no command line can carry (empty, NUL bytes, bad variable names)."""
    argv = [str(a) for a in argv]
    if not argv:
        raise ValueError("empty argv")
    if any("\0" in a for a in argv):
        raise ValueError("an argument contains a NUL byte")
    if env:
        bad = [k for k in env if not _ENV_NAME.fullmatch(k)]
        if bad:
            raise ValueError(f"invalid environment variable name(s): {bad}")
        if any("\0" in str(v) for v in env.values()):
            raise ValueError("an environment value contains a NUL byte")
    return argv


def _local_addr(sock) -> str | None:
    """This end's address of a TCP connection (what the node's sshd penalises and could exempt); None for a proxy."""
    try:
        return sock.getsockname()[0] if isinstance(sock, socket.socket) else None
    except OSError:
        return None


def _shown(argv: list[str]) -> str:
    """A command for a message: quoted, an inline program (python -c PROGRAM) shown as <program>, at most 200 chars."""
    return quote_argv(["<program>" if "\n" in a else a for a in argv])[:200]


def _why(exc: BaseException) -> str:
    """paramiko's messages may be empty or end in ': ' ("Server connection dropped: ")."""
    return str(exc).strip().rstrip(":").strip() or type(exc).__name__


def _policy(host: SSHHost, r: _Resolved, label: str, files: list[str]):
    """Unknown host key: refuse (strict), or record it in the known_hosts file (accept-new)."""
    import paramiko

    class Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            fp = fingerprint(key)
            if host.host_key_policy == "accept-new":
                _append_known_host(r.known_hosts, label, key)
                _log(host=host.name).warning("ssh.hostkey.accepted", label=label, key_type=key.get_name(),
                                             fingerprint=fp, file=r.known_hosts)
                return
            where = " or ".join(files) if files else f"{r.known_hosts} (which does not exist)"
            raise HostKeyError(
                f"{host.name}: unknown SSH host key for {label}: {key.get_name()} {fp}, not in {where}; nothing was "
                f"run. Check the fingerprint on the host (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then accept it: "
                f"ssh-keyscan -p {r.port} {r.hostname} >> {r.known_hosts}, or set host_key_policy: accept-new for this "
                f"host in the inventory (or pass --accept-new-host-key) to trust it on first use")

    return Policy()


def _changed_key_message(name: str, label: str, got, expected, files: list[str]) -> str:
    where = " or ".join(files)
    return (f"{name}: SSH host key for {label} CHANGED: the server offers {got.get_name()} {fingerprint(got)}, "
            f"{where} has {expected.get_name()} {fingerprint(expected)}; nothing was run. This is either a reinstalled "
            f"host or a man-in-the-middle. If the change is expected, remove the old key (ssh-keygen -R '{label}' "
            f"-f FILE) and accept the new one; host_key_policy: accept-new never replaces a changed key")


def _append_known_host(path: str, label: str, key) -> None:
    """Record a newly trusted key the way OpenSSH does: one line appended, file 0600, directory 0700."""
    from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)

    d = os.path.dirname(path)
    if d and not os.path.isdir(d):
        fs.fs_makedirs(d, 0o700)
    line = f"{label} {key.get_name()} {key.get_base64()}\n"
    fd = fs.fs_open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_size:
            with open(path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    line = "\n" + line
        fs.fs_write(fd, line.encode(), path)
        fs.fs_fsync(fd, path)
    finally:
        os.close(fd)


_quieted = False


def _quiet_paramiko() -> None:
    """paramiko logs transport errors with tracebacks through stdlib logging; ours speak through HostError."""
    global _quieted
    if not _quieted:
        import logging

        lg = logging.getLogger("paramiko")
        lg.addHandler(logging.NullHandler())
        lg.propagate = False
        _quieted = True


def _log(**ctx):
    from gpudoctor.log import get_logger

    return get_logger("gpudoctor.ssh", **ctx)
