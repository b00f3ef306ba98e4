"""Check many hosts concurrently, with a bound; one slow, broken or unreachable host never holds up the others.

`check_fleet(inventory, names, parallel, check_fn)` runs `check_fn(name) -> Diagnosis` on at most `parallel`
hosts at once. Each host gets its own record: its verdict, or "unreachable" (the transport failed or it did not
answer within `host_timeout`), or "error" (gpudoctor itself failed on it). A host that hangs past its deadline is
recorded and abandoned, and a fresh worker takes its place, so the bound still holds for the rest.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_UNKNOWN, EXIT_WARN, GpudoctorError, HostError, InputError

FLEET_SCHEMA = "gpudoctor.fleet/1"
STATUSES = ("ok", "warn", "fail", "unknown", "unreachable", "error")
_EXIT = {"ok": EXIT_OK, "warn": EXIT_WARN, "fail": EXIT_FAIL, "unknown": EXIT_UNKNOWN, "unreachable": EXIT_UNKNOWN,
         "error": EXIT_UNKNOWN}
RANK = {"fail": 4, "unknown": 3, "unreachable": 3, "error": 3, "warn": 2, "ok": 1}


@dataclass
class HostRecord:
    """The outcome of one host."""

    host: str
    status: str  # ok | warn | fail | unknown | unreachable | error
    duration_s: float = 0.0
    timestamp: float = 0.0
    error: str | None = None
    diagnosis: object = None  # the Diagnosis when the host was checked

    @property
    def exit_code(self) -> int:
        return _EXIT[self.status]

    @property
    def findings(self) -> list:
        return list(getattr(self.diagnosis, "findings", []) or [])

    @property
    def root_cause(self):
        roots = getattr(self.diagnosis, "root_causes", None) or []
        return roots[0] if roots else None

    @property
    def headline(self) -> str:
        if self.error:
            return self.error
        rc = self.root_cause
        return rc.summary if rc is not None else ""

    def to_json(self, full: bool = True) -> dict:
        rc = self.root_cause
        d = {"host": self.host, "status": self.status, "exit_code": self.exit_code,
             "duration_s": round(self.duration_s, 4), "timestamp": self.timestamp, "error": self.error,
             "root_cause": None if rc is None else {"key": rc.key, "summary": rc.summary, "hint": rc.hint,
                                                     "remedy": rc.remedy}}
        if full and self.diagnosis is not None and hasattr(self.diagnosis, "to_json"):
            d["check"] = self.diagnosis.to_json()
        return d

    def prom(self) -> dict:
        return {"host": self.host, "status": self.status, "findings": self.findings,
                "duration_s": self.duration_s, "timestamp": self.timestamp}


@dataclass
class FleetResult:
    records: list[HostRecord] = field(default_factory=list)  # in the order the hosts were given
    parallel: int = 32
    wall_s: float = 0.0

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for r in self.records:
            out[r.status] += 1
        return out

    @property
    def exit_code(self) -> int:
        """The worst host decides, in Nagios order: fail > unknown/unreachable/error > warn > ok."""
        if not self.records:
            return EXIT_OK
        return _EXIT[max((r.status for r in self.records), key=lambda s: RANK[s])]

    def to_json(self, full: bool = True) -> dict:
        return {"schema": FLEET_SCHEMA, "parallel": self.parallel, "wall_s": round(self.wall_s, 3),
                "exit_code": self.exit_code, "summary": self.counts(),
                "hosts": [r.to_json(full) for r in self.records]}

    def prom_records(self) -> list[dict]:
        return [r.prom() for r in self.records]


def select_hosts(inventory, *, all_hosts: bool = False, groups=(), hosts=()) -> list[str]:
    """Host names for --all / --group G / --host H (in inventory order, no duplicates); unknown names are bad input.

    Uses `Inventory.select` ("all", "@group", name or pattern) when the inventory has it.
    """
    if hasattr(inventory, "select"):
        specs = (["all"] if all_hosts else []) + [f"@{g}" for g in groups] + list(hosts)
        return list(dict.fromkeys(h.name for spec in specs for h in inventory.select(spec)))
    inv_hosts = list(getattr(inventory, "hosts", {}) or {})
    inv_groups = dict(getattr(inventory, "groups", {}) or {})
    path = getattr(inventory, "path", None)
    names: list[str] = []
    if all_hosts:
        names += inv_hosts
    for g in groups:
        if g not in inv_groups:
            known = ", ".join(sorted(inv_groups)) or "none defined"
            raise InputError(f"unknown group {g!r} (groups: {known})", path=path)
        names += list(inv_groups[g])
    for h in hosts:
        if h not in inv_hosts:
            raise InputError(f"unknown host {h!r}: not in the inventory", path=path)
        names.append(h)
    return list(dict.fromkeys(names))


def _classify(name: str, exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, HostError):
        return "unreachable", exc.one_line()
    if isinstance(exc, GpudoctorError):
        return "error", exc.one_line()
    return "error", f"{type(exc).__name__}: {exc}"


def check_fleet(inventory, names, parallel: int = 32, check_fn=None, *, host_timeout: float | None = None,
                on_done=None, clock=time.time) -> FleetResult:
    """Check `names` with at most `parallel` at once; every host gets a record, whatever the others do.

    check_fn(name) -> Diagnosis (default: gather over the inventory's transport and diagnose).
    host_timeout: seconds after which a host that has not answered is recorded unreachable and abandoned.
    on_done(record): called (from a worker thread) as each host finishes, e.g. for a progress bar.
    """
    names = list(dict.fromkeys(names))
    parallel = max(1, int(parallel))
    if check_fn is None:
        check_fn = default_check_fn(inventory)
    from gpudoctor.host import ssh

    # After the run every SSH connection it opened is closed and settled, those of hosts abandoned at their deadline
    # too, all in parallel at the end (a late login shell's end is awaited without holding a worker): nothing
    # gpudoctor started stays on a target (host/ssh.py: each session seen ending, or reaped).
    with ssh.deferred_settle():
        try:
            return _check_fleet(names, parallel, check_fn, host_timeout, on_done, clock)
        finally:
            ssh.close_all()


def _check_fleet(names, parallel, check_fn, host_timeout, on_done, clock) -> FleetResult:
    t0 = time.monotonic()
    queue = deque(names)
    records: dict[str, HostRecord] = {}
    started: dict[str, float] = {}
    lock = threading.Lock()
    done = threading.Condition(lock)

    def finish(rec: HostRecord) -> None:
        with lock:
            if rec.host in records:  # already recorded as timed out; the late answer is dropped
                return
            records[rec.host] = rec
            started.pop(rec.host, None)
            done.notify_all()
        if on_done is not None:
            try:
                on_done(rec)
            except Exception:  # noqa: BLE001 - a progress callback must not lose a record
                pass

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                name = queue.popleft()
                started[name] = time.monotonic()
                running_by[name] = threading.current_thread()
            ts = clock()
            t = time.monotonic()
            try:
                diag = check_fn(name)
                status = getattr(diag, "verdict", None)
                status = getattr(status, "value", status) or "unknown"
                rec = HostRecord(name, status, time.monotonic() - t, ts, diagnosis=diag)
            except BaseException as exc:  # noqa: BLE001 - one host's failure is that host's record
                status, msg = _classify(name, exc)
                rec = HostRecord(name, status, time.monotonic() - t, ts, error=msg)
            finish(rec)
            with lock:
                if threading.current_thread() not in live:
                    return  # replaced after a timeout: let the replacement carry on

    live: set[threading.Thread] = set()
    running_by: dict[str, threading.Thread] = {}

    def spawn() -> None:
        th = threading.Thread(target=worker, name="gpudoctor-fleet", daemon=True)
        live.add(th)
        th.start()

    with lock:
        for _ in range(min(parallel, len(names))):
            spawn()
    with lock:
        while len(records) < len(names):
            done.wait(timeout=0.05 if host_timeout else 1.0)
            if host_timeout:
                now = time.monotonic()
                for name, st in list(started.items()):
                    if now - st > host_timeout and name not in records:
                        records[name] = HostRecord(name, "unreachable", now - st, clock(),
                                                   error=f"did not answer in {host_timeout:g} s")
                        started.pop(name)
                        # its worker is stuck: retire it (it exits if it ever returns) and start a fresh one
                        live.discard(running_by.get(name))
                        if queue:
                            spawn()
    return FleetResult([records[n] for n in names], parallel, time.monotonic() - t0)


def default_check_fn(inventory, timeout: float = 10.0):
    """check_fn over the inventory's transports: each host's Target through pipeline.check_host."""
    from gpudoctor.target import resolve_inventory

    inventory = resolve_inventory(inventory)

    def check(name: str):
        from gpudoctor.pipeline import check_host
        from gpudoctor.target import open_target

        with open_target(name, inventory, timeout=timeout) as target:
            return check_host(target)

    return check
