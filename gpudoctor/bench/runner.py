"""Run a campaign: per configuration gate the host, start the server, wait for it, run its levels, stop it, and wait
for the GPUs to be free. Resumable: records are keyed, so a rerun with --resume only does what is missing.

An infrastructure failure (the gate fails and cannot be healed, the port is taken, GPU memory is not released) stops the
campaign with CampaignStopped instead of recording garbage. A server that crashes or never becomes ready is a result:
its levels are recorded as crashed/error with the log lines that say why, and the campaign goes on.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from gpudoctor.bench import logscan
from gpudoctor.bench.campaign import Campaign, Config
from gpudoctor.bench.levels import Level, run_levels, server_context_limit, wait_ready, workload_name
from gpudoctor.bench.load import LevelSpec
from gpudoctor.bench.prompts import build, load_source, misfit
from gpudoctor.bench.results import CRASHED, ERROR, ResultStore
from gpudoctor.bench.server import LocalLauncher, port_in_use, reap_orphan, wait_gpu_release
from gpudoctor.bench.tokens import Counter, load_counter
from gpudoctor.errors import EXIT_FAIL, GpudoctorError, InputError
from gpudoctor.host.base import Host


class CampaignStopped(GpudoctorError):
    """The campaign cannot go on without producing garbage (the host is not healthy, a port is taken, ...)."""

    exit_code = EXIT_FAIL


def levels_for(camp: Campaign, cfg: Config, counter: Counter, cache: dict) -> list[Level]:
    """Every level of one configuration, in run order, with its prompts (built once per shape)."""
    out = []
    for w in camp.workloads:
        questions = cache.setdefault(("q", w.prompts), load_source(w.prompts))
        set_name = w.name
        for max_tokens in w.max_tokens:
            for ctx in w.context_lengths:
                for trial in range(w.trials):
                    for c in camp.concurrency:
                        n = w.num_prompts or max(8, 4 * c)
                        spec = LevelSpec(label=cfg.label, method=cfg.method.name, tp=cfg.tp, trial=trial,
                                         workload=workload_name(set_name, ctx, max_tokens), concurrency=c,
                                         max_tokens=max_tokens, num_prompts=n, context_len=ctx)
                        key = ("p", w.prompts, ctx, n, trial)
                        if key not in cache:
                            cache[key] = build(n, questions, counter, ctx, seed=1000 * trial + c)
                        out.append(Level(spec, cache[key]))
    return out


def static_context_limit(camp: Campaign, cfg: Config) -> int | None:
    """The context limit known before launch: the campaign's, the server's --context-length, or config.json."""
    if camp.context_limit:
        return camp.context_limit
    argv = cfg.argv
    for i, a in enumerate(argv):
        if a == "--context-length" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if a.startswith("--context-length=") and a.split("=", 1)[1].isdigit():
            return int(a.split("=", 1)[1])
    try:
        conf = json.loads((Path(camp.model) / "config.json").read_text())
        value = conf.get("max_position_embeddings")
        return int(value) if isinstance(value, int) else None
    except (OSError, ValueError):
        return None


def _tail(text: str, n: int = 3) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return " | ".join(lines[-n:])


class Runner:
    """One campaign run into one output directory."""

    def __init__(self, camp: Campaign, out_dir: str, *, host: Host, on_event: Callable[..., None] | None = None):
        self.camp, self.host = camp, host
        self.dir = Path(out_dir)
        self.store = ResultStore(self.dir)
        self.emit = on_event or (lambda *a, **k: None)
        self.counter = load_counter(camp.tokenizer_dir)
        self.cache: dict = {}

    # ---- the campaign ---------------------------------------------------------------------------------------------
    def run(self, resume: bool) -> dict:
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.dir / ".lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError("another gpudoctor bench run is writing to this directory", path=str(self.dir)) from None
        if self.store.path.exists() and not resume:
            raise InputError("holds results of an earlier run: pass --resume to continue it, or choose another --out",
                             path=str(self.dir))
        note = reap_orphan(str(self.dir / "server.pid"), self.camp.timeouts["stop_s"])
        if note:
            self.emit("note", text=note)
        shutil.copyfile(self.camp.path, self.dir / "campaign.yaml")
        (self.dir / "campaign.json").write_text(json.dumps(
            {"name": self.camp.name, "baseline": self.camp.baseline, "methods": [m.name for m in self.camp.methods],
             "tp": self.camp.tp, "concurrency": self.camp.concurrency, "token_counts": self.counter.source},
            indent=1))
        self.emit("note", text=f"token counts: {self.counter.source}")
        for cfg in self.camp.configs():
            self.run_config(cfg)
        recs = self.store.load()
        return {s: sum(1 for r in recs if r["status"] == s) for s in ("ok", "crashed", "error", "skipped")}

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
        self.apply_limit(todo, static_context_limit(camp, cfg))
        if all(lv.misfit for lv in todo):
            asyncio.run(run_levels(camp.base_url, self.store, todo, warmup=0, on_event=self.emit))
            return
        attempts = 2 if camp.on_crash == "restart" else 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            if not self.serve(cfg, record_skips=last) or last:
                return
            todo = [lv for lv in todo if lv.key not in self.store.keys()]
            if not todo:
                return
            self.emit("note", text=f"restarting {cfg.label} for {len(todo)} levels after a crash")

    @staticmethod
    def apply_limit(levels: list[Level], limit: int | None) -> None:
        for lv in levels:
            lv.misfit = misfit(lv.prompts, lv.spec.max_tokens, limit)

    # ---- one server -------------------------------------------------------------------------------------------------
    def serve(self, cfg: Config, record_skips: bool) -> bool:
        """Start the server, run the levels, stop it. True when a crash left levels for a restart to run."""
        camp, t = self.camp, self.camp.timeouts
        if port_in_use(camp.client_host, camp.port):
            raise CampaignStopped(f"port {camp.port} on {camp.client_host} is already in use before starting "
                                  f"{cfg.label}: another server is running there; stop it and rerun with --resume")
        log_path = str(self.dir / "logs" / f"{cfg.label}.log")
        launcher = LocalLauncher(log_path, str(self.dir / "server.pid"))
        watch = logscan.LogWatch(log_path)
        self.emit("note", text=f"starting: {' '.join(cfg.argv)}")
        t0 = time.monotonic()
        try:
            launcher.start(cfg.argv, cfg.env)
        except OSError as exc:
            raise CampaignStopped(f"cannot start the server for {cfg.label}: {cfg.argv[0]}: {exc.strerror}") from None
        broken = False
        try:
            not_ready = asyncio.run(wait_ready(camp.base_url, t["ready_s"], alive=launcher.gone))
            if not_ready:
                self.record_not_ready(cfg, launcher.gone() is not None, not_ready, watch.read_new())
                return False
            self.emit("note", text=f"ready in {time.monotonic() - t0:.1f} s")
            todo = [lv for lv in levels_for(camp, cfg, self.counter, self.cache) if lv.key not in self.store.keys()]
            live = asyncio.run(server_context_limit(camp.base_url))
            self.apply_limit(todo, live or static_context_limit(camp, cfg))
            written = asyncio.run(run_levels(
                camp.base_url, self.store, todo, stall_s=t["stall_s"], level_timeout_s=t["level_s"],
                warmup=camp.warmup, log_path=log_path, server_gone=launcher.gone, record_skips=record_skips,
                on_event=self.emit))
            broken = any(r["status"] == CRASHED for r in written) and len(written) < len(todo)
        finally:
            launcher.stop(t["stop_s"])
            self.emit("note", text=f"stopped {cfg.label}")
            busy = wait_gpu_release(self.host, camp.gpu_release_mib, t["gpu_release_s"])
            if busy:
                raise CampaignStopped(f"after stopping {cfg.label}: {busy}")
        return broken

    def record_not_ready(self, cfg: Config, died: bool, why: str, log_text: str) -> None:
        cause = logscan.reason(log_text) if log_text else None
        msg = f"server never became ready: {why}" + (f"; server log: {cause}" if cause else "")
        done = self.store.keys()
        for lv in levels_for(self.camp, cfg, self.counter, self.cache):
            if lv.key in done:
                continue
            rec = {**lv.spec.head(), "status": CRASHED if died else ERROR, "completed": 0, "error": msg,
                   "log_excerpt": logscan.excerpt(log_text) if log_text else None}
            rec = self.store.append(rec)
            self.emit("level_done", record=rec)

    # ---- preflight ------------------------------------------------------------------------------------------------
    def validate(self, cfg: Config) -> tuple[str, str] | None:
        """Check the SGLang flags with `gpudoctor sglang validate` before a long model load.

        Returns (error, details) when SGLang would refuse them (the levels are recorded as errors, nothing launched),
        None when they are valid, have warnings, or could not be checked (then a note says why).
        """
        import sys

        argv = [sys.executable, "-m", "gpudoctor", "sglang", "validate", "--json", "--", *cfg.sglang_args]
        res = self.host.run(argv, timeout=120)
        try:
            out = json.loads(res.stdout)
        except ValueError:
            self.emit("note", text=f"sglang validate could not check {cfg.label}: {res.describe()}")
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
    def gate(self, cfg: Config) -> None:
        camp = self.camp
        if not camp.gate_command:
            return
        argv = list(camp.gate_command)
        res = self.host.run(argv, timeout=camp.timeouts["gate_s"])
        if res.ok:
            self.emit("note", text=f"gate passed: {' '.join(argv)}")
            return
        first = f"{res.describe()}; {_tail(res.stdout + res.stderr)}"
        if camp.heal_command:
            heal = self.host.run(list(camp.heal_command), timeout=camp.timeouts["gate_s"])
            self.emit("note", text=f"gate failed; heal: {heal.describe()}")
            res = self.host.run(argv, timeout=camp.timeouts["gate_s"])
            if res.ok:
                self.emit("note", text="gate passed after healing")
                return
        raise CampaignStopped(f"gate failed before {cfg.label}, campaign stopped (nothing recorded for it): {first}"
                              + ("" if not camp.heal_command else f"; after healing: {res.describe()}"))


def run_campaign(path: str, out_dir: str, *, resume: bool = False, host: Host | None = None,
                 on_event: Callable[..., None] | None = None) -> dict:
    """Load, validate and run a campaign file; returns counts of records by status."""
    from gpudoctor.bench.campaign import load
    from gpudoctor.host.local import LocalHost

    camp = load(path)
    return Runner(camp, out_dir, host=host or LocalHost(), on_event=on_event).run(resume)
