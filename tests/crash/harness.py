"""The crash-point harness (issue #40, item 7): every mutating file step a writer makes goes through host/ops.py's
seam (ops.RECORDER). For one writer it

1. runs it once, uninterrupted, in a forked child that records every step: n steps, their order;
2. for every k in 0..n-1 rebuilds the "before" world, runs it again in a forked child that dies with os._exit at
   step k+1 (right after the k-th step: no finally block, no rollback, as after SIGKILL), then checks what it left:
   every file is byte for byte its old or its new content (never torn, never missing), backups are whole copies,
   the audit log holds no record of a change that is not there and says "started" for one that is half there;
3. runs the same command again, uninterrupted, and checks it converges to the uninterrupted run's final state;
4. reads the recorded order: every rename of a file the run wrote comes after an fsync of that file (a node made by
   mknod has no data).

Content that differs between two uninterrupted runs (timestamps, pids) is "volatile": such a file must be whole
(JSON that parses), not equal. Names are compared with their timestamps folded (corrupt-N, backup stamps).

Issue #48 added: 5. the states a power cut leaves (tests/crash/power.py: the recording run snapshots the world
before each step; each state is built in the writer's temp dir and read back), judged like a kill's (a log may end
in one torn line there: its readers skip it, the next append starts a fresh one); 6. each writer's invariants over
all its files (tests/crash/invariants.py), checked in every kill and power-loss state.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpudoctor.host import ops

KILLED = 77  # the exit status of a child stopped at its crash point
FAILED = 3  # the writer itself failed (an uninterrupted run must succeed)
HUNG = -999  # the child did not end within CHILD_TIMEOUT_S
CHILD_TIMEOUT_S = 180.0

# Temp names the product uses beside a target (never a target themselves): files/atomic.py `.NAME.HEX.tmp`,
# files/edit.py `NAME.tmp.gpudoctor.PID.HEX`, remedies/common.temp_beside `.NAME.gpudoctor.PID.HEX`,
# model/stage.py `.NAME.gpudoctor-part`.
TEMP = re.compile(r"(^\..+\.[0-9a-f]{8}\.tmp$)|(\.tmp\.gpudoctor\.\d+\.[0-9a-f]+$)|(^\..+\.gpudoctor\.\d+\.[0-9a-f]+$)"
                  r"|(\.gpudoctor-part$)")
STAMP = re.compile(r"\d{8}T\d{6}\.\d{6}Z(\.\d+)?|corrupt-\d+")


@dataclass
class Writer:
    """One command that changes files: `setup(base)` builds the world before it (deterministically, under base),
    `facts(ctx)` what it plans from (gathered once, reused by the crashed runs; gathered again for the rerun),
    `run(ctx, facts)` the command itself (raises when it did not succeed)."""

    name: str
    kind: str  # "remedy" | "state"
    setup: Callable[[Path], Any]
    run: Callable[[Any, Any], None]
    facts: Callable[[Any], Any] = lambda ctx: None
    logs: tuple = ()  # append-only logs (glob on the relative path): prefix kept, every line whole
    locks: tuple = ()  # lock files: empty or one whole JSON line
    ignore: tuple = ()  # the world's own files the stand-in tools write (their call logs)
    audit: str | None = None  # relative path of the remedy engine's audit log
    extra_roots: Callable[[Any], list] = lambda ctx: []  # directories outside base the writer changes
    may_vanish: tuple = ()  # files that may be absent mid-run (globs): an invariant says what their absence means
    invariants: tuple = ()  # callables (judge, now, where) -> [break, ...] over the whole world (invariants.py)


@dataclass
class Report:
    name: str
    kind: str
    steps: int = 0
    ops: dict = field(default_factory=dict)
    crash_points: int = 0
    power_states: int = 0
    invariant_breaks: int = 0
    failures: list = field(default_factory=list)
    leftover_temps: int = 0  # temp files a kill left (hidden names beside their target)
    temps_after_rerun: int = 0  # of those, still there after the rerun converged

    def line(self) -> str:
        return (f"{self.name}: {self.steps} steps ({', '.join(f'{k} {v}' for k, v in sorted(self.ops.items()))}), "
                f"{self.crash_points} crash points, {self.power_states} power-loss states, "
                f"{len(self.failures)} failures ({self.invariant_breaks} invariant breaks)"
                + (f" ({self.leftover_temps} temp files left by kills, {self.temps_after_rerun} after the reruns)"
                   if self.leftover_temps else ""))


# --- running a writer in a child ----------------------------------------------------------------------------

def _child(fn, stop_at: int | None, out: str | None, roots: list | None = None) -> int:
    """Fork; the child runs fn under a recorder that ends it at step stop_at+1; returns the child's exit status.
    With out, the steps are written there (JSON); with roots too, the world before each step and at the end
    (out + ".worlds", a pickle): the material of the power-loss states."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = FAILED
        steps: list = []
        worlds: list = []
        lock = threading.Lock()

        def recorder(op, path, *detail):
            with lock:
                if stop_at is not None and len(steps) >= stop_at:
                    os._exit(KILLED)
                if roots is not None:
                    worlds.append(tree(roots))
                steps.append([op, os.fspath(path), [os.fspath(d) if isinstance(d, os.PathLike) else d
                                                    for d in detail], threading.get_ident()])

        try:
            ops.RECORDER = recorder
            fn()
            code = 0
        except BaseException:  # noqa: BLE001 - the parent reports it
            traceback.print_exc()
        finally:
            ops.RECORDER = None
            if out:
                with open(out, "w") as fh:
                    json.dump(steps, fh)
                if roots is not None:
                    import pickle

                    worlds.append(tree(roots))
                    with open(out + ".worlds", "wb") as fh:
                        pickle.dump(worlds, fh)
            os._exit(code)
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while True:  # a child that hangs (a lock another thread held at fork) is killed and reported, never waited on
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return HUNG
        time.sleep(0.01)


# --- the state of the world ---------------------------------------------------------------------------------

def _norm(rel: str) -> str:
    return STAMP.sub("STAMP", rel)


def tree(roots: list[Path]) -> dict:
    """rel path -> ("file", bytes, mode) | ("char", major, minor, mode) | ("dir", mode) | ("link", target)."""
    out = {}
    for i, root in enumerate(roots):
        if not root.exists():
            continue
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                p = os.path.join(dirpath, name)
                rel = f"{i}:" + os.path.relpath(p, root)
                st = os.lstat(p)
                m = stat.S_IMODE(st.st_mode)
                if stat.S_ISREG(st.st_mode):
                    with open(p, "rb") as fh:
                        out[rel] = ("file", fh.read(), m)
                elif stat.S_ISCHR(st.st_mode):
                    out[rel] = ("char", os.major(st.st_rdev), os.minor(st.st_rdev), m)
                elif stat.S_ISDIR(st.st_mode):
                    out[rel] = ("dir", m)
                elif stat.S_ISLNK(st.st_mode):
                    out[rel] = ("link", os.readlink(p))
                else:
                    out[rel] = ("other",)
    return out


def _match(rel: str, patterns) -> bool:
    import fnmatch

    path = rel.split(":", 1)[1]
    return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(os.path.basename(path), p) for p in patterns)


def _is_temp(rel: str) -> bool:
    return bool(TEMP.search(os.path.basename(rel.split(":", 1)[1])))


def _is_backup(rel: str) -> bool:
    return "gpudoctor/backups/" in rel


def _whole_json(data: bytes) -> bool:
    if not data.strip():
        return False
    try:
        json.loads(data)
        return True
    except ValueError:
        pass
    if not data.endswith(b"\n"):
        return False
    try:
        for ln in data.splitlines():
            json.loads(ln)
        return True
    except ValueError:
        return False


# --- the checks ---------------------------------------------------------------------------------------------

class Judge:
    def __init__(self, w: Writer, after: dict, after2: dict):
        self.w = w
        self.after = {_norm(k): v for k, v in after.items()}
        after2 = {_norm(k): v for k, v in after2.items()}
        self.volatile = {k for k in set(self.after) | set(after2) if self.after.get(k) != after2.get(k)}
        self.before: dict = {}
        self.contents: set = set()
        self.breaks = 0  # invariant breaks found so far

    def start(self, before: dict) -> None:
        """The world this crash point's run started from (a setup may stamp times of its own)."""
        self.before = {_norm(k): v for k, v in before.items()}
        self.contents = {v[1] for v in before.values() if v[0] == "file"}

    def _skip(self, rel: str) -> bool:
        return (_is_temp(rel) or _match(rel, self.w.ignore) or _is_backup(rel)
                or (self.w.audit is not None and rel.split(":", 1)[1] == self.w.audit))

    def targets(self) -> list[str]:
        return sorted(k for k in set(self.before) | set(self.after)
                      if not self._skip(k) and (self.before.get(k) or self.after.get(k) or ("x",))[0] != "dir")

    def crashed(self, now_raw: dict, k, power: bool = False) -> list[str]:
        """What is wrong with the world a run killed after step k left (k: the step, or a power-loss state's
        label; power: a log may end in one torn line)."""
        now = {_norm(r): v for r, v in now_raw.items()}
        at = k if isinstance(k, str) else f"after step {k}"
        bad = []
        for rel in self.targets():
            old, new, cur = self.before.get(rel), self.after.get(rel), now.get(rel)
            if _match(rel, self.w.locks):
                if cur is not None and cur[0] == "file" and cur[1] and not _whole_json(cur[1]):
                    bad.append(f"{at}: lock file {rel} holds a torn record {cur[1][:60]!r}")
                continue
            if _match(rel, self.w.logs):
                had = old[1] if old is not None and old[0] == "file" else b""
                if old is not None and (cur is None or not cur[1].startswith(had)):
                    bad.append(f"{at}: log {rel} lost what it held before")
                elif cur is not None and len(cur[1]) > len(had):
                    added = cur[1][len(had):]  # what this run appended (what was there, torn or not, is not its)
                    if power:
                        added = _torn_tail_off(added)
                    if added and not (added.endswith(b"\n") and (not rel.endswith("jsonl") or all(
                            _whole_json(ln + b"\n") for ln in added.splitlines() if ln.strip()))):
                        bad.append(f"{at}: log {rel} holds a torn line")
                continue
            if cur == old or cur == new or (cur is None and _match(rel, self.w.may_vanish)):
                continue
            if cur is None and old is not None and any(
                    _norm(r) == rel + ".STAMP" and v == old for r, v in now_raw.items()):
                continue  # an unreadable file set aside whole (recovery/daemon state), its place empty until written
            if rel in self.volatile and cur is not None and new is not None and cur[0] == new[0] == "file" \
                    and _whole_json(cur[1]):
                continue
            what = "missing" if cur is None else ("torn" if cur[0] == "file" else f"neither old nor new: {cur}")
            bad.append(f"{at}: {rel} is {what} (old {_short(old)}, new {_short(new)}, now {_short(cur)})")
        for rel, cur in now.items():
            if _is_backup(rel) and cur[0] == "file" and not _is_temp(rel) \
                    and cur[1] not in self.contents:
                bad.append(f"{at}: backup {rel} is not a whole copy of any file that was there")
            if rel not in self.before and rel not in self.after and not self._skip(rel) and cur[0] != "dir" \
                    and not _is_backup(rel):
                bad.append(f"{at}: {rel} is neither in the old nor the new world ({_short(cur)})")
        self.raw = now_raw  # names unfolded: two backups whose names differ by their stamps alone
        breaks = [f"{at}: invariant: {b}" for inv in self.w.invariants for b in inv(self, now, power)]
        self.breaks += len(breaks)
        return bad + breaks

    def is_log_or_lock(self, rel: str) -> bool:
        return _match(rel, self.w.locks) or _match(rel, self.w.logs)

    @staticmethod
    def is_temp(rel: str) -> bool:
        return _is_temp(rel)

    def changed(self, now: dict) -> list[str]:
        """The targets (not logs or locks) that differ from the world before."""
        return [t for t in self.targets() if now.get(t) != self.before.get(t)
                and not _match(t, self.w.locks) and not _match(t, self.w.logs)]

    def durable(self, now_raw: dict) -> list[str]:
        """A power cut right after the run returned: every file it wrote is its new content (logs too)."""
        now = {_norm(r): v for r, v in now_raw.items()}
        bad = []
        for rel in sorted(set(now) | set(self.after)):
            if self._skip(rel) and not (self.w.audit and rel == "0:" + self.w.audit) or _match(rel, self.w.locks):
                continue
            cur, ref = now.get(rel), self.after.get(rel)
            if cur == ref or (ref is not None and ref[0] == "dir"):
                continue
            if rel in self.volatile and cur is not None and ref is not None and cur[0] == ref[0] == "file" \
                    and _whole_json(cur[1]) and cur[1].count(b"\n") == ref[1].count(b"\n"):
                continue  # timestamps differ; every record is there
            bad.append(f"a power cut after the run returned: {rel} is {_short(cur)}, the run left {_short(ref)} "
                       f"(not durable when it returned)")
        return bad

    def converged(self, now_raw: dict, k: int) -> list[str]:
        now = {_norm(r): v for r, v in now_raw.items()}
        bad = []
        for rel in sorted(set(now) | set(self.after)):
            if self._skip(rel) or _match(rel, self.w.logs):
                continue
            cur, ref = now.get(rel), self.after.get(rel)
            if cur == ref:
                continue
            if rel in self.volatile and cur is not None and ref is not None and cur[0] == ref[0] == "file" \
                    and _whole_json(cur[1]):
                continue
            if _match(rel, self.w.locks) and cur is not None and cur[0] == "file" \
                    and (not cur[1] or _whole_json(cur[1])):
                continue  # a lock file: what a killed holder wrote stays until the next holder (flock is the lock)
            bad.append(f"crash after step {k}, then a rerun: {rel} is {_short(cur)}, an uninterrupted run leaves "
                       f"{_short(ref)}")
        for rel, cur in now.items():
            if _is_temp(rel) and cur[0] == "char":
                bad.append(f"crash after step {k}, then a rerun: a temp device node {rel} is left behind")
        if self.w.audit:
            cur = now.get("0:" + self.w.audit)
            last = json.loads(cur[1].splitlines()[-1]) if cur and cur[1].strip() else {}
            # "started" without an outcome: the killed run; the rerun found nothing left to do, so wrote nothing
            if last.get("result") not in ("applied", "unchanged", "started"):
                bad.append(f"crash after step {k}, then a rerun: the audit log's last record is "
                           f"{last.get('result')!r}")
        return bad


def _torn_tail_off(data: bytes) -> bytes:
    """A log after a power cut: its last line may be cut short (an append not yet fsynced, written back in part)."""
    return data if data.endswith(b"\n") or not data else data[:data.rfind(b"\n") + 1]


def _short(v) -> str:
    if v is None:
        return "absent"
    if v[0] == "file":
        return f"{len(v[1])} bytes {v[1][:40]!r} mode {v[2]:o}"
    return repr(v)


def check_order(steps: list) -> list[str]:
    """Every rename of a file this run wrote follows an fsync of that file (after its last change). (That the
    rename's directory is fsynced after it is fs_rename's own doing; what its loss would cost is judged by the
    power-loss states: "durable when it returned", tests/crash/test_power_loss.py.)"""
    bad = []
    for i, (op, path, detail, tid) in enumerate(steps):
        if op != "rename":
            continue
        dst = detail[0]
        mine = [s for s in steps[:i] if s[1] == path]
        if any(s[0] == "mknod" for s in mine):
            pass  # a device node has no data to flush
        elif any(s[0] in ("create", "truncate", "write") for s in mine):
            last_change = max(j for j, s in enumerate(mine) if s[0] in ("create", "truncate", "write", "chmod",
                                                                         "chown", "utime"))
            if not any(s[0] == "fsync" for s in mine[last_change + 1:]):
                bad.append(f"step {i + 1}: rename {path} -> {dst} without an fsync of {path} after its last change")
    return bad


# --- one writer, every crash point --------------------------------------------------------------------------

def crash_all(w: Writer, work: Path, limit: int | None = None, power: bool = True) -> Report:
    """Run the whole enumeration for one writer under `work` (rebuilt for every crash point); power: also every
    power-loss state of the recorded run."""
    rep = Report(w.name, w.kind)
    base = work / w.name
    env = dict(os.environ)

    def fresh():
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(parents=True)
        ctx = w.setup(base)
        return ctx, [base, *w.extra_roots(ctx)]

    def world(roots):
        return tree(roots)

    try:
        ctx, roots = fresh()
        facts = w.facts(ctx)
        steps_file = work / f"{w.name}.steps.json"
        rc = _child(lambda: w.run(ctx, facts), None, str(steps_file), roots)
        if rc != 0:
            rep.failures.append(f"the uninterrupted run failed (exit {rc})")
            return rep
        steps = json.loads(steps_file.read_text())
        import pickle

        worlds = pickle.loads(Path(str(steps_file) + ".worlds").read_bytes())
        after = world(roots)
        rep.steps = len(steps)
        for s in steps:
            rep.ops[s[0]] = rep.ops.get(s[0], 0) + 1
        rep.failures += check_order(steps)
        ctx, roots = fresh()
        if _child(lambda: w.run(ctx, facts), None, None) != 0:
            rep.failures.append("the second uninterrupted run failed")
            return rep
        judge = Judge(w, after, world(roots))
        points = range(rep.steps) if limit is None else range(min(rep.steps, limit))
        for k in points:
            ctx, roots = fresh()
            judge.start(world(roots))
            rc = _child(lambda: w.run(ctx, facts), k, None)
            rep.crash_points += 1
            if rc != KILLED:
                rep.failures.append(f"crash point {k}: the run was not stopped there (exit {rc}): its steps differ "
                                    f"from run to run")
                continue
            now = world(roots)
            rep.leftover_temps += sum(1 for r in now if _is_temp(r))
            rep.failures += judge.crashed(now, k)
            rc = _child(lambda: w.run(ctx, w.facts(ctx)), None, None)
            if rc != 0:
                rep.failures.append(f"crash after step {k}, then a rerun: the rerun failed (exit {rc})")
                continue
            final = world(roots)
            rep.temps_after_rerun += sum(1 for r in final if _is_temp(r))
            rep.failures += judge.converged(final, k)
        if power:
            _power_all(w, rep, judge, steps, worlds, fresh)
        rep.invariant_breaks = judge.breaks
    finally:
        os.environ.clear()
        os.environ.update(env)
    return rep


def _power_all(w: Writer, rep: Report, judge: Judge, steps: list, worlds: list, fresh) -> None:
    """Every power-loss state of the recorded run, built on disk where the writer's world lies, read back, judged."""
    from tests.crash import power

    ctx, roots = fresh()
    judge.start(worlds[0])
    for label, state in power.states(steps, worlds, roots):
        power.materialize(state, roots)
        rep.power_states += 1
        rep.failures += judge.crashed(tree(roots), label, power=True)
    power.materialize(power.returned(steps, worlds, roots), roots)
    rep.failures += judge.durable(tree(roots))
