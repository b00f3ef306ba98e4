"""The ladder's persisted store: one JSON file per machine (every host it watches), atomic writes, one lock.

The daemon and a gate (or `gpudoctor release`) may run at the same moment: every change happens inside
`RecoveryStore.edit()`, which holds an exclusive flock on FILE.lock, reads the file, lets the caller move the ladder
and writes it back atomically (gpudoctor.files.atomic). A long verification never runs under that lock: it takes
`verify_lock()` (non-blocking: a second verifier does not queue behind the first) and records its result through
`edit()`, where the ladder ignores it unless it is still due. An unreadable file is moved aside and never trusted:
every host starts again as never verified, so nothing is released on the strength of a broken file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from gpudoctor.files.atomic import atomic_write
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)
from gpudoctor.log import get_logger
from gpudoctor.recovery.ladder import HostLadder

SCHEMA = "gpudoctor.recovery/1"
FILE = "recovery.json"


def state_dir() -> Path:
    """Where gpudoctor keeps its state: $STATE_DIRECTORY (systemd's StateDirectory=), /var/lib/gpudoctor as root,
    else $XDG_STATE_HOME/gpudoctor. The daemon's state and the ladder live there side by side."""
    base = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if base:
        return Path(base)
    if os.geteuid() == 0:
        return Path("/var/lib/gpudoctor")
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "gpudoctor"


def default_path() -> Path:
    return state_dir() / FILE


class RecoveryStore:
    """Loads, locks and saves every host's HostLadder."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else default_path()
        self.log = get_logger("gpudoctor.recovery", store=str(self.path))
        self.aside: str | None = None  # where an unreadable file was moved, for the caller's report

    def _read(self) -> dict:
        from gpudoctor.files.inputs import read_bytes

        # as root: the ladder decides drains and resumes, so the file is root's by the one rule, judged on the fd read
        raw = read_bytes(self.path, what="recovery file", obeyed=True, missing_ok=True)  # (#40, #47)
        if raw is None:
            return {}
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
                raise ValueError(f"schema {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                                 f"expected {SCHEMA!r}")
            return {str(k): HostLadder.from_json(v) for k, v in (doc.get("hosts") or {}).items()}
        except (ValueError, TypeError, AttributeError) as exc:
            return self._set_aside(exc)

    def _set_aside(self, exc) -> dict:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            fs.fs_rename(self.path, aside)
            self.aside = str(aside)
        except OSError:
            self.aside = None
        self.log.error("recovery.store_unreadable", error=str(exc), moved_to=self.aside)
        return {}

    def load(self) -> dict:
        """Every host's ladder, read under the lock (a reader never sees a half-moved ladder); no file is no record,
        and reading it creates nothing."""
        if not self.path.exists():
            return {}
        with self._locked():
            return self._read()

    def get(self, host: str) -> HostLadder | None:
        return self.load().get(host)

    @contextlib.contextmanager
    def _locked(self, name: str = ".lock", blocking: bool = True):
        fs.fs_makedirs(str(self.path.parent))
        fd = fs.fs_open(str(self.path) + name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def edit(self):
        """`with store.edit() as hosts:` — the ladders under the lock, written back when the block ends cleanly."""
        with self._locked():
            hosts = self._read()
            yield hosts
            self._write(hosts)

    def _write(self, hosts: dict) -> None:
        doc = {"schema": SCHEMA, "hosts": {k: v.to_json() for k, v in sorted(hosts.items())}}
        atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n", mode=0o600)

    @contextlib.contextmanager
    def verify_lock(self):
        """True when this process may run the verification now; False while another one runs it."""
        with self._locked(".verify.lock", blocking=False) as got:
            yield got
