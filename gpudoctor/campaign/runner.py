"""Run a campaign: per configuration gate the host, start the server, wait for it, run its levels, stop it, and wait
for the GPUs to be free. Resumable: records are keyed, so a rerun with --resume only does what is missing.

An infrastructure failure (the gate fails and cannot be healed, the port is taken, GPU memory is not released) stops the
campaign with CampaignStopped instead of recording garbage. A server that crashes or never becomes ready is a result:
its levels are recorded as crashed/error with the log lines that say why, and the campaign goes on.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from gpudoctor.files import safe
from gpudoctor.files.atomic import atomic_write
from gpudoctor.bench.server import logscan
from gpudoctor.campaign.file import Campaign, Config, check_gate_profile, check_paths, load
from gpudoctor.campaign.heal import Healer
from gpudoctor.bench.client.levels import Level, run_levels, server_context_limit, skipped_record, wait_ready, workload_name
from gpudoctor.bench.client.load import LevelSpec
from gpudoctor.gather.marker import server_env
from gpudoctor.host.childpy import python_argv
from gpudoctor.bench.client.prompts import build, load_names, load_source, misfit
from gpudoctor.bench.records.results import CRASHED, ERROR, OK, ResultStore, key
from gpudoctor.bench.server.remote import HostLauncher, reap_remote_orphan, reap_run_dir
from gpudoctor.bench.cell.health import process_tree
from gpudoctor.bench.server.launch import Launcher, LocalLauncher, port_in_use, reap_orphan, wait_gpu_release
from gpudoctor.bench.client.tokens import Counter, load_counter
from gpudoctor.errors import EXIT_FAIL, ConfigError, GpudoctorError, HostError, HostUnreachable, InputError
from gpudoctor.host.base import Host
from gpudoctor.target import local_host


class CampaignStopped(GpudoctorError):
    """The campaign cannot go on without producing garbage (the host is not healthy, a port is taken, ...)."""

    exit_code = EXIT_FAIL


class GateRefused(CampaignStopped):
    """The gate failed before a configuration (and healing, if any, did not help): the host is refused. `said` is
    what was asked and what it said (a Slurm job reports it; the submitter drains the node with `reason`)."""

    def __init__(self, message: str, said: str, reason: str, *, before: str = "", verdict: dict | None = None):
        super().__init__(message)
        self.said, self.reason = said, reason  # reason: the gate's own first words (why), for a drain reason
        # the configuration it stopped before, and the gate's own verdict: gpudoctor's gate judged in process, its
        # `gate --json` document (gpudoctor.gate/1); a command, its argv, exit code and last lines
        self.before, self.verdict = before, verdict
        self.counts: dict | None = None  # the records of the run so far, by status (run_campaign fills it in)


def levels_for(camp: Campaign, cfg: Config, counter: Counter, cache: dict) -> list[Level]:
    """Every level of one configuration, in run order, with its prompts (built once per shape)."""
    out = []
    for w in camp.workloads:
        if w.turns or w.trace:
            out += agentic_levels(camp, cfg, w, counter, cache)
            continue
        questions = cache.setdefault(("q", w.prompts), load_source(w.prompts))
        names = cache.setdefault(("names", w.prompts), load_names(w.prompts))
        set_name = w.name
        for max_tokens in w.max_tokens:
            for ctx in w.context_lengths:
                for trial in range(w.trials):
                    loads = [(c, None) for c in camp.concurrency] + [(None, r) for r in camp.request_rates]
                    for c, rate in loads:
                        n = w.num_prompts or (max(8, 4 * c) if c else max(16, int(rate * 10)))
                        spec = LevelSpec(label=cfg.label, method=cfg.method.name, tp=cfg.tp, trial=trial,
                                         workload=workload_name(set_name, ctx, max_tokens), concurrency=c,
                                         max_tokens=max_tokens, num_prompts=n, context_len=ctx, api=camp.api,
                                         server_kind=camp.kind if camp.api != "native" else None,
                                         request_rate=rate, arrival=camp.arrival, max_error_rate=camp.max_error_rate,
                                         slo_ttft_ms=camp.slo_ttft_ms, slo_itl_ms=camp.slo_itl_ms)
                        text_only = camp.api == "chat"  # chat messages are text, never token ids
                        key = ("p", w.prompts, ctx, n, trial, text_only)
                        if key not in cache:
                            cache[key] = build(n, questions, Counter() if text_only else counter, ctx,
                                               seed=1000 * trial + (c or int(rate * 1000)), names=names)
                        out.append(Level(spec, cache[key]))
    return out


def agentic_levels(camp: Campaign, cfg: Config, w, counter: Counter, cache: dict) -> list[Level]:
    """A multi-turn workload's levels (per max_tokens, trial and concurrency: that many sessions at a time) or a
    trace's (one per trial, open loop at the trace's own times x time_scale)."""
    from gpudoctor.bench.client import multiturn, trace
    common = dict(label=cfg.label, method=cfg.method.name, tp=cfg.tp, api=camp.api,
                  max_error_rate=camp.max_error_rate, slo_ttft_ms=camp.slo_ttft_ms, slo_itl_ms=camp.slo_itl_ms)
    out = []
    if w.trace:
        entries = cache.setdefault(("trace", w.trace), trace.load_trace(w.trace))
        due = trace.offsets(entries, w.time_scale)
        for t in range(w.trials):
            spec = LevelSpec(workload=f"{w.name}:trace:x{w.time_scale:g}", concurrency=None,
                             max_tokens=max(e.output_length for e in entries), num_prompts=len(entries),
                             request_rate=round((len(entries) - 1) / due[-1], 6), arrival="trace", trial=t, **common)
            key = ("tp", w.trace, w.block_tokens, t, camp.api == "chat")
            if key not in cache:
                cache[key] = trace.build_prompts(entries, Counter() if camp.api == "chat" else counter,
                                                 w.block_tokens, seed=t)
            prompts = cache[key]
            out.append(Level(spec, prompts, send=trace.sender(spec, entries, prompts, w.time_scale, w.block_tokens)))
        return out
    convs = None
    for max_tokens in w.max_tokens:
        for t in range(w.trials):
            for c in camp.concurrency:
                n = w.num_prompts or c
                if convs is None:
                    convs = (multiturn.load_conversations(w.conversations, w.turns) if w.conversations
                             else multiturn.builtin(max(n, 8), w.turns))
                spec = LevelSpec(workload=f"{w.name}:turns{w.turns}:out{max_tokens}", concurrency=c,
                                 max_tokens=max_tokens, num_prompts=n, trial=t, **common)
                out.append(Level(spec, [], send=multiturn.sender(spec, convs, w.turns, w.think_s)))
    return out


def static_context_limit(camp: Campaign, cfg: Config, model_dir: str | None) -> int | None:
    """The context limit known before launch: the campaign's, the server's --context-length, or config.json
    (read from `model_dir`, the model's files as seen here: camp.model, their copy from a remote target, or None)."""
    if camp.context_limit:
        return camp.context_limit
    argv = cfg.argv
    for i, a in enumerate(argv):
        if a == "--context-length" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--context-length=") and a.split("=", 1)[1].isdigit():
            return int(a.split("=", 1)[1])
    if model_dir is None:
        return None
    try:
        conf = json.loads((Path(model_dir) / "config.json").read_text())
        value = conf.get("max_position_embeddings")
        return int(value) if isinstance(value, int) else None
    except (OSError, ValueError):
        return None


def status_counts(recs: list[dict]) -> dict[str, int]:
    """Records by status, as `bench run` reports them."""
    return {s: sum(1 for r in recs if r["status"] == s) for s in ("ok", "crashed", "error", "skipped")}


def _tail(text: str, n: int = 3) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " | ".join(lines[-n:])


def _is_gpudoctor(argv: list[str]) -> bool:
    """`gpudoctor ...` or `PYTHON -m gpudoctor ...`: a command that understands --host and --inventory."""
    return bool(argv) and (os.path.basename(argv[0]) == "gpudoctor" or ["-m", "gpudoctor"] in (argv[1:3], argv[2:4]))


def _has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def write_meta(out_dir: Path, camp: Campaign, meta: dict) -> None:
    """DIR/campaign.yaml (the campaign's text as it was parsed: what --resume compares) and DIR/campaign.json (what
    the report reads), each replaced whole."""
    safe.write_file(out_dir / "campaign.yaml", camp.text.encode())  # links at the names replaced
    safe.write_file(out_dir / "campaign.json", json.dumps(meta, indent=1))


def held_campaign(dfd: int, out_dir: Path, camp: Campaign) -> None:
    """An output directory holds one campaign: refuse (InputError, one line, before anything is written or
    submitted) a campaign whose content differs from DIR/campaign.yaml — its content hash, not its name — and a
    directory with results or Slurm state but no campaign.yaml (nothing proves whose they are)."""
    try:
        fd = safe.open_regular(dfd, "campaign.yaml", os.O_RDONLY, path=str(out_dir / "campaign.yaml"))
    except safe.Unsafe:
        if not os.path.islink(out_dir / "campaign.yaml"):
            raise
        fd = None  # a link is no campaign of ours: never opened, replaced when the run writes its own
    except FileNotFoundError:
        fd = None
    if fd is None:
        for name in ("results.jsonl", "slurm/state.json"):
            if os.path.lexists(out_dir / name):
                raise InputError(f"holds {name} but no campaign.yaml: nothing proves which campaign it is of; "
                                 "choose another --out", path=str(out_dir)) from None
        return
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(32 << 20)
    held = raw.decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    sha = hashlib.sha256(held.encode("utf-8", errors="surrogateescape")).hexdigest()
    if sha != camp.sha256:
        raise InputError(f"holds another campaign (its campaign.yaml has sha256 {sha[:12]}, {camp.path} has "
                         f"{camp.sha256[:12]}): --resume continues only the campaign the directory holds; choose "
                         "another --out", path=str(out_dir))


class Runner:
    """One campaign run into one output directory.

    `host` is where the servers run: this machine (LocalHost) or the campaign's target over SSH. `sglang validate`
    and gpudoctor's own gate are judged in this process (the gate on the target, opened through gpudoctor.target);
    another gate or heal command runs here, a gpudoctor command in it pointed at a remote target with
    `--host TARGET --inventory INVENTORY`.
    """

    def __init__(self, camp: Campaign, out_dir: str, *, host: Host, on_event: Callable[..., None] | None = None,
                 inventory_path: str | None = None, heal_engine_factory=None, health_nvml=None,
                 only: tuple[str, ...] | None = None):
        self.camp, self.host = camp, host
        self.only = only  # run only the configurations with these labels (a Slurm job runs one: bench job)
        self.local = local_host() if camp.is_remote else host
        self.inventory_path = inventory_path
        self.dir = Path(out_dir)
        self.store = ResultStore(self.dir)
        self.emit = on_event or (lambda *a, **k: None)
        self.counter = Counter()
        self.model_dir: str | None = camp.model  # the model's config files as seen from here
        self.cache: dict = {}
        self.healer = None  # gpudoctor.campaign.heal.Healer when the campaign has `heal:`
        self.heal_engine_factory = heal_engine_factory  # the daemon engine the healer uses (default: the pipeline)
        self.health_nvml = health_nvml  # an NVML-like module for the sampler (default: pynvml)
        self.last_gate: dict | None = None  # the gate's verdict before the current configuration (provenance)
        self.gate_reason = ""  # the last gate's first words: why it refused
        self.gate_verdict: dict | None = None  # the last gate's verdict, as GateRefused carries it

    # ---- the campaign ---------------------------------------------------------------------------------------------
    def cell_watch(self, launcher: Launcher, cfg: Config | None = None):
        """What runs around each level of this server (gpudoctor.bench.cell.watch): its cache flushed per the campaign,
        its GPUs sampled here (a local server: its session's processes are the server's)."""
        from gpudoctor.bench.cell.watch import CellWatch

        from gpudoctor.bench.cell.health import RemoteSampler

        camp, h = self.camp, self.camp.health
        remote = None
        if camp.is_remote:  # the sampler runs on the target, next to the server, started through the Host seam
            pgid = getattr(launcher, "pid", None)
            remote = lambda: RemoteSampler(self.host, self.remote_dir, getattr(launcher, "label", "server"),  # noqa: E731
                                           gpus=h.gpus,
                                           interval_s=h.interval_s, kernel_log=h.kernel_log, server_pgid=pgid,
                                           max_s=camp.timeouts["level_s"] + 60)
        proc = getattr(launcher, "proc", None)
        pids = (lambda: process_tree(proc.pid)) if proc is not None else None
        base = {"campaign": {"path": camp.real_path, "sha256": camp.sha256, "name": camp.name},
                "host": {"name": camp.target if camp.is_remote else socket.gethostname(),
                         "remote": bool(camp.is_remote)},
                "check": self.last_gate or {"status": "not run", "why": "the campaign has no gate command"}}
        if cfg is not None:
            base["server"] = {"command": list(cfg.argv), "label": cfg.label}
        return CellWatch(cache_policy=camp.cache, sample=h.sample, nvml=self.health_nvml, gpus=h.gpus,
                         interval_s=h.interval_s, kernel_log=h.kernel_log, server_pids=pids,
                         thresholds=camp.suspect, sampler=remote, base=base)

    def retract_suspect(self) -> int:
        """--rerun-suspect: take the suspect records out (to retracted.jsonl, with their reasons) so exactly their
        levels run again; returns how many."""
        recs = self.store.load()
        bad = [r for r in recs if r.get("suspect")]
        if bad:
            self.store.retract([key(r) for r in bad], "suspect: " + "; ".join(
                sorted({x["reason"].split(" at ")[0] for r in bad for x in r["suspect"]}))[:500])
        return len(bad)

    def run(self, resume: bool) -> dict:
        if self.store.path.exists() and not resume:
            raise InputError("holds results of an earlier run: pass --resume to continue it, or choose another --out",
                             path=str(self.dir))
        created = not self.dir.exists()
        # --out is ours (#40): created 0755, refused when another user owns or can write it or a directory above it
        # (every later write in it goes by path); the lock is opened without following a link
        dfd = safe.owned_dir(str(self.dir))
        lock_path = self.dir / ".lock"
        try:
            lock = os.fdopen(safe.open_regular(dfd, ".lock", os.O_WRONLY | os.O_CREAT, 0o600, path=str(lock_path)),
                             "w")
        except BaseException:
            os.close(dfd)
            if created:
                os.rmdir(self.dir)
            raise
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(lock.fileno()).st_ino != os.stat(lock_path).st_ino:  # a finished run removed it meanwhile
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            lock.close()
            os.close(dfd)
            raise InputError("another gpudoctor bench run is writing to this directory", path=str(self.dir)) from None
        try:
            try:
                if self.store.path.exists() and not resume:  # written while we took the lock
                    raise InputError("holds results of an earlier run: pass --resume to continue it, or choose "
                                     "another --out", path=str(self.dir))
                held_campaign(dfd, self.dir, self.camp)  # under the lock: before anything is written or submitted
            finally:
                os.close(dfd)
            return self._run()
        finally:
            lock_path.unlink(missing_ok=True)  # while still holding it: no run, refused or not, leaves its lock behind
            lock.close()
            if created:
                try:
                    self.dir.rmdir()  # only when the run wrote nothing
                except OSError:
                    pass

    def _run(self) -> dict:
        try:
            note = self.reap()
            if note:
                self.emit("note", text=note)
            if self.camp.is_remote:
                self.model_dir = self.mirror(
                    self.camp.model, ["config.json", "model.safetensors.index.json"], "model",
                    "the context limit comes from the server, and sglang validate has no model config")
            self.counter = self.load_counter()
        except HostError as exc:
            raise CampaignStopped(f"cannot prepare the campaign on {self.camp.target}: {exc.one_line()}") from None
        write_meta(self.dir, self.camp, (
            {"name": self.camp.name, "baseline": self.camp.baseline, "methods": [m.name for m in self.camp.methods],
             "workloads": [w.name for w in self.camp.workloads], "kind": self.camp.kind, "api": self.camp.api,
             "request_rates": self.camp.request_rates,
             "tp": self.camp.tp, "concurrency": self.camp.concurrency, "token_counts": self.counter.source,
             "target": self.camp.target, "server_url": self.camp.base_url,
             "remote_dir": self.remote_dir if self.camp.is_remote else None}))
        if self.camp.is_remote:
            self.emit("note", text=f"servers run on {self.camp.target} (logs there in {self.remote_dir}); "
                                   f"load goes to {self.camp.base_url}")
        self.emit("note", text=f"token counts: {self.counter.source}")
        if self.camp.heal is not None:
            self.healer = self.make_healer()
        try:
            for cfg in self.camp.configs():
                if self.only is None or cfg.label in self.only:
                    self.run_config(cfg)
        finally:
            if self.healer is not None:
                self.healer.close()
        return status_counts(self.store.load())

    def run_config(self, cfg: Config) -> None:
        camp = self.camp
        done = self.store.keys()
        levels = levels_for(camp, cfg, self.counter, self.cache)
        todo = [lv for lv in levels if lv.key not in done]
        if not todo:
            self.emit("config", label=cfg.label, what=f"complete ({len(levels)} levels recorded), skipped")
            return
        self.emit("config", label=cfg.label, what=f"{len(todo)} of {len(levels)} levels to run")
        invalid = self.validate(cfg) if camp.validate else None
        if invalid:
            for lv in todo:
                rec = self.store.append({**lv.spec.head(), "status": ERROR, "completed": 0, "error": invalid[0],
                                         "log_excerpt": invalid[1]})
                self.emit("level_done", record=rec)
            return
        self.gate(cfg)
        self.apply_limit(todo, static_context_limit(camp, cfg, self.model_dir))
        if all(lv.misfit for lv in todo):
            asyncio.run(run_levels(camp.base_url, self.store, todo, warmup=0, on_event=self.emit))
            return
        restarts = 1 if camp.on_crash == "restart" else 0
        incidents = 0
        while True:
            before = self.store.keys()
            left, why, lost = self.serve(cfg, record_skips=restarts == 0 and self.healer is None)
            if not left:
                return
            if self.healer is not None and self.heal(cfg, why, lost, before):
                incidents += 1
                if incidents > camp.heal.rounds:
                    raise CampaignStopped(f"the target broke {incidents} times during {cfg.label}; last: {why}; "
                                          f"run gpudoctor check{'' if not camp.is_remote else ' --host ' + camp.target}"
                                          f", then {self.resume_hint}")
                continue
            todo = [lv for lv in levels_for(camp, cfg, self.counter, self.cache) if lv.key not in self.store.keys()]
            if not todo:
                return
            if restarts == 0:  # the healer judged the crash the method's own: the rest is not run
                for lv in todo:
                    self.emit("level_done", record=self.store.append(skipped_record(lv, f"not run: {why}")))
                return
            restarts -= 1
            self.emit("note", text=f"restarting {cfg.label} for {len(todo)} levels after a crash")

    def make_healer(self):
        healer = Healer(self.camp.heal, target=self.camp.target if self.camp.is_remote else None,
                        inventory=self.inventory_path, models=(self.camp.model,), out_dir=self.dir, emit=self.emit,
                        resume_hint=self.resume_hint, engine_factory=self.heal_engine_factory)
        last = next((i for i in reversed(healer.incidents) if i.healed), None)
        if last is not None:  # a resumed run: what it records now still comes after that heal
            self.store.stamp = {"heal": last.stamp()}
        return healer

    @property
    def resume_hint(self) -> str:
        return f"gpudoctor bench run {self.camp.path} --out {self.dir} --resume"

    def heal(self, cfg: Config, why: str, lost: bool, before: set) -> bool:
        """After a crash or a lost target: True when the target was broken and is healed (the records the broken
        target produced are retracted, their levels run again); False when it is healthy and the crash was the
        method's own. Stops the campaign with one line when it cannot be healed."""
        inc = self.healer.recover(f"{why} ({cfg.label})")
        if inc.healthy and not inc.broken and not lost:
            self.healer.save(inc)
            return False
        if not inc.healthy:
            self.healer.save(inc)
            raise CampaignStopped(inc.line())
        new = [r for r in self.store.load() if key(r) not in before]
        first = next((i for i, r in enumerate(new) if r["status"] != OK), len(new))
        keys = [key(r) for r in new[first:]]
        inc.retracted = [list(k) for k in keys]
        self.store.retract(keys, f"heal {inc.n}: {inc.reason}")
        self.healer.save(inc)
        self.store.stamp = {"heal": inc.stamp()}
        self.emit("note", text=f"{len(keys)} record(s) of the broken target retracted; {cfg.label} goes on from its "
                               "first incomplete level")
        return True

    @staticmethod
    def apply_limit(levels: list[Level], limit: int | None) -> None:
        for lv in levels:
            lv.misfit = misfit(lv.prompts, lv.spec.max_tokens, limit)

    # ---- where the servers run ------------------------------------------------------------------------------------
    @property
    def remote_dir(self) -> str:
        """This run's directory on the target: one per output directory (and machine), stable across --resume."""
        tag = hashlib.sha1(f"{socket.gethostname()}:{self.dir.resolve()}".encode()).hexdigest()[:8]
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.camp.name)[:40]
        return f"{self.camp.remote_dir.rstrip('/') or '/'}/{name}-{tag}"

    def launcher(self, cfg: Config) -> Launcher:
        log_path, pid_file = str(self.dir / "logs" / f"{cfg.label}.log"), str(self.dir / "server.pid")
        if self.camp.is_remote:
            return HostLauncher(self.host, self.remote_dir, cfg.label, log_path, pid_file)
        return LocalLauncher(log_path, pid_file)

    def reap(self) -> str | None:
        """Stop a server an interrupted run left behind (DIR/server.pid), here or on the target."""
        pid_file = self.dir / "server.pid"
        try:
            info = json.loads(pid_file.read_text())
        except (OSError, ValueError):
            info = None
        stop_s = self.camp.timeouts["stop_s"]
        if not isinstance(info, dict) or not info.get("host"):
            note = reap_orphan(str(pid_file), stop_s)
        elif self.camp.is_remote and info["host"] == self.host.name:
            note = reap_remote_orphan(self.host, info, stop_s)
            pid_file.unlink()
        else:
            note = (f"{pid_file} names a server on {info['host']}, which this campaign does not target: not stopped "
                    f"(pid {info.get('pid')}; stop it there if it still runs)")
            pid_file.unlink()
        if self.camp.is_remote:  # also a server whose start was cut short before server.pid was written
            note = "; ".join(n for n in [note, *reap_run_dir(self.host, self.remote_dir, stop_s)] if n) or None
        return note

    def mirror(self, remote_dir: str, names: list[str], local_name: str, without: str) -> str | None:
        """Copy files of a model directory on the target to DIR/remote-files/LOCAL_NAME; that directory, or None
        when the first file (the one that matters) could not be read: then a note says so and what that means
        (`without`)."""
        dest = self.dir / "remote-files" / local_name
        for i, name in enumerate(names):
            path = f"{remote_dir.rstrip('/')}/{name}"
            got = self.host.read_file(path, timeout=60.0, max_bytes=64 << 20)
            if not got.ok:
                if i == 0:
                    self.emit("note", text=f"{self.camp.target}:{path} not read ({got.error}): {without}")
                    return None
                continue
            dest.mkdir(parents=True, exist_ok=True)
            atomic_write(dest / name, got.data, mode=safe.output_mode())
        return str(dest)

    def load_counter(self) -> Counter:
        """Exact token counts from the model's tokenizer.json (copied from a remote target), else the estimate."""
        tok_dir = self.camp.tokenizer_dir
        if not self.camp.is_remote:
            return load_counter(tok_dir)
        import importlib.util

        if importlib.util.find_spec("tokenizers") is None:
            return Counter(source="estimate: the `tokenizers` package is not installed here, so "
                                  f"{self.camp.target}:{tok_dir}/tokenizer.json is not used")
        local = self.mirror(tok_dir, ["tokenizer.json"], "tokenizer", "token counts are estimated")
        counter = load_counter(local)
        if counter.exact:
            counter.source = f"exact: {self.camp.target}:{tok_dir.rstrip('/')}/tokenizer.json"
        return counter

    # ---- one server -------------------------------------------------------------------------------------------------
    def serve(self, cfg: Config, record_skips: bool) -> tuple[bool, str | None, bool]:
        """Start the server, run the levels, stop it: (levels left after a crash, why, the target was lost)."""
        try:
            broken = self._serve(cfg, record_skips)
            return bool(broken), broken or None, False
        except HostError as exc:
            why = f"lost {self.camp.target} while running {cfg.label}: {exc.one_line()}"
            if self.healer is None:
                raise CampaignStopped(f"{why}; rerun with --resume (it first stops a server left running "
                                      "there)") from None
            return True, why, True

    def _serve(self, cfg: Config, record_skips: bool) -> str | None:
        camp, t = self.camp, self.camp.timeouts
        if port_in_use(camp.client_host, camp.port):
            raise CampaignStopped(f"port {camp.port} on {camp.client_host} is already in use before starting "
                                  f"{cfg.label}: another server is running there; stop it and rerun with --resume")
        launcher = self.launcher(cfg)
        log_path = launcher.log_path
        watch = logscan.LogWatch(log_path)
        where = f" on {camp.target}" if camp.is_remote else ""
        self.emit("note", text=f"starting{where}: {' '.join(cfg.argv)}")
        t0 = time.monotonic()
        try:
            launcher.start(cfg.argv, {**cfg.env, **server_env(self.remote_dir if camp.is_remote else str(self.dir),
                                                              cfg.label)})
        except OSError as exc:
            raise CampaignStopped(f"cannot start the server for {cfg.label}: {cfg.argv[0]}: {exc.strerror}") from None
        watch.sync = launcher.sync_log
        broken = None
        try:
            not_ready = asyncio.run(wait_ready(camp.base_url, t["ready_s"], alive=launcher.gone, api=camp.api))
            if not_ready:
                died = launcher.gone() is not None
                self.record_not_ready(cfg, died, not_ready, watch.read_new())
                # with a healer, a server that died at start may have met a broken target: let it judge
                return f"the server never became ready ({not_ready})" if died and self.healer is not None else None
            self.emit("note", text=f"ready in {time.monotonic() - t0:.1f} s")
            todo = [lv for lv in levels_for(camp, cfg, self.counter, self.cache) if lv.key not in self.store.keys()]
            live = asyncio.run(server_context_limit(camp.base_url))
            self.apply_limit(todo, live or static_context_limit(camp, cfg, self.model_dir))
            written = asyncio.run(run_levels(
                camp.base_url, self.store, todo, stall_s=t["stall_s"], level_timeout_s=t["level_s"],
                warmup=camp.warmup, log_path=log_path, log_sync=launcher.sync_log, server_gone=launcher.gone,
                record_skips=record_skips, on_event=self.emit, watch=self.cell_watch(launcher, cfg)))
            crashed = next((r for r in written if r["status"] == CRASHED), None)
            if crashed is not None and (len(written) < len(todo) or self.healer is not None):
                broken = f"the server crashed during workload {crashed['workload']} at concurrency " \
                         f"{crashed['concurrency']}"
        finally:
            launcher.stop(t["stop_s"])
            self.emit("note", text=f"stopped {cfg.label}")
            busy = wait_gpu_release(self.host, camp.gpu_release_mib, t["gpu_release_s"])
            if busy:
                raise CampaignStopped(f"after stopping {cfg.label}: {busy}" + (f" (on {camp.target})" if where else ""))
        return broken

    def record_not_ready(self, cfg: Config, died: bool, why: str, log_text: str) -> None:
        cause = logscan.reason(log_text) if log_text else None
        msg = f"server never became ready: {why}" + (f"; server log: {cause}" if cause else "")
        done = self.store.keys()
        for lv in levels_for(self.camp, cfg, self.counter, self.cache):
            if lv.key in done:
                continue
            rec = {**lv.spec.head(), "status": CRASHED if died else ERROR, "completed": 0, "error": msg,
                   **logscan.record_fields(log_text)}
            rec = self.store.append(rec)
            self.emit("level_done", record=rec)

    # ---- preflight ------------------------------------------------------------------------------------------------
    def validate(self, cfg: Config) -> tuple[str, str] | None:
        """Check the SGLang flags with gpudoctor's SGLang rules (in this process) before a long model load.

        For a remote target the model's and draft's config.json are the copies read from the target.
        Returns (error, details) when SGLang would refuse them (the levels are recorded as errors, nothing launched),
        None when they are valid, have warnings, or could not be checked (then a note says why).
        """
        from gpudoctor.errors import GpudoctorError
        from gpudoctor.sglang import validate

        model_config = draft_config = None
        if self.camp.is_remote:
            model_config = self.model_dir or None
            draft = cfg.method.draft_model
            if draft:
                tag = hashlib.sha1(draft.encode()).hexdigest()[:8]
                try:
                    draft_config = self.mirror(draft, ["config.json"], f"draft-{tag}",
                                               "sglang validate has no draft model config") or None
                except HostError as exc:
                    raise CampaignStopped(f"lost {self.camp.target} reading {draft}: {exc.one_line()}") from None
        try:
            out = validate(list(cfg.sglang_args), model_config, draft_config,
                           paths_here=not self.camp.is_remote).to_json()
        except GpudoctorError as exc:
            self.emit("note", text=f"sglang validate could not check {cfg.label}: {exc.one_line()}")
            return None
        bad = [f for f in out.get("findings", []) if f.get("status") == "fail"]
        warn = [f for f in out.get("findings", []) if f.get("status") == "warn"]
        for f in warn:
            self.emit("note", text=f"sglang validate warns: {f.get('summary')}")
        if out.get("verdict") != "invalid" or not bad:
            self.emit("note", text=f"sglang validate: {out.get('verdict')}")
            return None
        details = "\n".join(f"FAIL {f['id']}: {f['summary']}" + (f"\n  fix: {f['data']['fix']}"
                                                                  if (f.get("data") or {}).get("fix") else "")
                             for f in bad)
        return (f"not launched: sglang validate says SGLang would refuse these flags: "
                + "; ".join(f["summary"] for f in bad), details)

    # ---- the gate -----------------------------------------------------------------------------------------------------
    def for_target(self, argv: list[str]) -> list[str]:
        """A gpudoctor command aimed at the remote target: `--host TARGET --inventory INVENTORY` added.

        A bare `gpudoctor` that is not on PATH (gpudoctor run as `python -m gpudoctor`) is this gpudoctor."""
        argv = list(argv)
        if argv and argv[0] == "gpudoctor" and shutil.which("gpudoctor") is None:
            argv = python_argv([sys.executable], "-m", "gpudoctor", *argv[1:])  # -I: not the cwd's gpudoctor (#40)
        if self.camp.is_remote and _is_gpudoctor(argv) and not _has_flag(argv, "--host"):
            argv += ["--host", self.camp.target]
            if self.inventory_path and not _has_flag(argv, "--inventory"):
                argv += ["--inventory", self.inventory_path]
        return argv

    def gate_argv(self, cfg: Config) -> list[str]:
        """The gate command for one configuration. `gpudoctor gate` gets the models it serves as --model (the
        campaign's model and the method's draft) unless it names its own: the benchmark profile requires
        workload.model.*, which only runs for a model it is given, so without them a healthy host would block."""
        argv = self.for_target(self.camp.gate_command)
        if _is_gpudoctor(argv) and "gate" in argv and not _has_flag(argv, "--model"):
            for model in (self.camp.model, cfg.method.draft_model):
                if model:
                    argv += ["--model", model]
        return argv

    def gate_once(self, cfg: Config) -> tuple[bool, str]:
        """(passed, what was asked and what it said). gpudoctor's own `gate` is judged here, in process, on the
        campaign's target through the one seam (gpudoctor.target → pipeline.check_host → gate profile); any other
        command runs as written (a gpudoctor command in it aimed at the target)."""
        camp, call = self.camp, self.camp.gate_call
        if call is None:
            argv = self.gate_argv(cfg)
            res = self.local.run(argv, timeout=camp.timeouts["gate_s"])
            self.gate_reason = next((x.strip() for x in (res.stdout + "\n" + res.stderr).splitlines() if x.strip()),
                                    res.describe())  # its first words: why it refused (a Slurm node's drain reason)
            self.gate_verdict = {"command": argv, "exit_code": res.rc, "pass": res.ok,
                                 "output": _tail(res.stdout + res.stderr, 20)}
            return res.ok, " ".join(argv) if res.ok else f"{res.describe()}; {_tail(res.stdout + res.stderr)}"
        from gpudoctor.gate import gate_target
        from gpudoctor.report import gate_lines
        from gpudoctor.target import open_target

        models = call.models or tuple(m for m in (camp.model, cfg.method.draft_model) if m)
        spec = call.host or (camp.target if camp.is_remote else None)
        with open_target(spec, call.inventory or self.inventory_path, expect_gpus=call.expect_gpus, models=models,
                         sglang_url=call.sglang_url, timeout=call.timeout) as target:
            result = gate_target(target, call.profile)
        self.gate_verdict = result.to_json()
        what = (f"gpudoctor gate, profile {result.profile}, on {result.host}"
                + "".join(f" --model {m}" for m in models))
        if result.passed:
            return True, what
        lines = [text for text, _ in gate_lines(result)]  # root causes first
        self.gate_reason = lines[0] if lines else result.headline
        more = f" (and {len(lines) - 1} more: gpudoctor gate{f' --host {spec}' if spec else ''})" if len(lines) > 1 else ""
        return False, f"{what} → exit {result.exit_code}: {lines[0]}{more}"

    def gate(self, cfg: Config) -> None:
        camp = self.camp
        if not camp.gate_command:
            return
        ok, said = self.gate_once(cfg)
        self.last_gate = {"status": "passed" if ok else "failed", "said": said[:400], "before": cfg.label,
                          "at": time.time()}
        if ok:
            self.emit("note", text=f"gate passed: {said}")
            return
        first = said
        if camp.heal_command:
            heal = self.local.run(self.for_target(camp.heal_command), timeout=camp.timeouts["gate_s"])
            self.emit("note", text=f"gate failed; heal: {heal.describe()}")
            ok, said = self.gate_once(cfg)
            self.last_gate = {"status": "passed after healing" if ok else "failed", "said": said[:400],
                              "before": cfg.label, "at": time.time()}
            if ok:
                self.emit("note", text="gate passed after healing")
                return
        raise GateRefused(f"gate failed before {cfg.label}, campaign stopped (nothing recorded for it): {first}"
                          + ("" if not camp.heal_command else f"; after healing: {said}"), said, self.gate_reason,
                          before=cfg.label, verdict=self.gate_verdict)


def _loopback(address: str) -> bool:
    import ipaddress

    if address in ("local", "localhost"):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def aim_client(camp: Campaign, address: str) -> None:
    """Where the load goes for a remote target: the server must listen where this machine can reach it.

    `address` is the target's as gpudoctor reaches it over SSH. A server told to listen on a wildcard address is
    reached there (unless server.client_host says otherwise); one told to listen on loopback cannot be reached from
    another machine, so that campaign is refused before anything starts.
    """
    if camp.client_host_given:
        return
    if camp.host in ("0.0.0.0", "::", "[::]"):
        camp.client_host = "127.0.0.1" if _loopback(address) else address
    elif _loopback(camp.host) and not _loopback(address):
        raise ConfigError(
            f"target {camp.target} is reached at {address}, but its servers would listen on {camp.host} (server.host), "
            f"which this machine cannot reach: set server.host: 0.0.0.0 (or {camp.target}'s address) so SGLang "
            f"listens where gpudoctor can send load (server.client_host: the address to connect to, default "
            f"{address}), or run gpudoctor on {camp.target} itself with target: local",
            path=camp.path, line=camp.target_line)


def open_campaign_target(camp: Campaign, inventory: str | None = None, host_key_policy: str | None = None):
    """The Host the campaign's servers run on, connected (host key checked), and the inventory file used."""
    from gpudoctor.inventory import load_inventory
    from gpudoctor.target import open_target

    inv = load_inventory(inventory)
    if camp.target not in inv.hosts:
        raise ConfigError(f"target {camp.target!r} is not a host of the inventory {inv.path} "
                          f"(hosts: {', '.join(sorted(inv.hosts)) or 'none'})", path=camp.path, line=camp.target_line)
    target = open_target(camp.target, inv, host_key_policy=host_key_policy)
    host = target.host
    address = host.resolve().hostname if target.remote else "local"
    aim_client(camp, address)
    connect = getattr(host, "connect", None)
    if connect is not None:
        try:
            connect()  # an unknown or changed host key stops here (HostKeyError, exit 3), before anything runs
        except HostUnreachable as exc:
            raise CampaignStopped(f"cannot reach the campaign's target: {exc.one_line()}") from None
    return host, inv.path


def run_campaign(path: str, out_dir: str, *, resume: bool = False, host: Host | None = None,
                 inventory: str | None = None, on_event: Callable[..., None] | None = None,
                 host_key_policy: str | None = None, heal_engine_factory=None, rerun_suspect: bool = False,
                 health_nvml=None) -> dict:
    """Load, validate and run a campaign file; returns counts of records by status.

    A remote `target:` is looked up in the inventory (`inventory`, else gpudoctor's default locations) and
    connected before anything else happens; `host` overrides where the servers run, `heal_engine_factory` the
    daemon engine the healer judges and heals with (gpudoctor.daemon.engine.Engine; default: the pipeline).
    `rerun_suspect` (an earlier run's directory): its suspect records are retracted and only their levels run
    again; `health_nvml` is the NVML-like module the host-health sampler reads (default: pynvml).
    """
    camp = load(path)
    check_gate_profile(camp, inventory)
    inventory_path = None
    if host is None:
        if camp.is_remote:
            host, inventory_path = open_campaign_target(camp, inventory, host_key_policy)
            if on_event is not None:  # the inventory that named the target (the CLI says it as every command does)
                on_event("inventory", path=inventory_path)
        else:
            host = local_host()
    try:
        check_paths(camp, host)
        runner = Runner(camp, out_dir, host=host, on_event=on_event, inventory_path=inventory_path,
                        heal_engine_factory=heal_engine_factory, health_nvml=health_nvml)
        if rerun_suspect:
            if not runner.store.path.exists():
                raise InputError("--rerun-suspect needs the directory of an earlier run (no results.jsonl here)",
                                 path=str(runner.dir))
            n = runner.retract_suspect()
            if on_event:
                on_event("note", text=f"{n} suspect record(s) retracted to retracted.jsonl; their levels run again")
            if not n:
                return status_counts(runner.store.load())
            resume = True
        try:
            return runner.run(resume)
        except GateRefused as exc:  # what the run recorded before the gate stopped it (bench run --json says)
            exc.counts = status_counts(runner.store.load())
            raise
    finally:
        host.close()
