"""What happens around every level (a cell): the prefix cache recorded and flushed before it (gpudoctor.bench.cell.cache),
the host's GPUs sampled during it (gpudoctor.bench.cell.health), and the verdict after it (gpudoctor.bench.cell.suspect).

The record gets `cache`, `host_health` and `suspect`, `server_counters` (the server's Prometheus counters over the
level: gpudoctor.bench.cell.counters) and `provenance` (what produced it: gpudoctor.bench.cell.provenance; `base`
holds what the caller knows — the campaign's hash and launch command, its gate verdict).
A target this process cannot sample (a remote one without a
sampler, NVML missing) gets `host_health: {status: unavailable, reason}` — a level is never recorded without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudoctor.bench.cell import cache as cachelib
from gpudoctor.bench.cell import counters as counterlib
from gpudoctor.bench.cell import provenance as provlib
from gpudoctor.bench.cell import health as healthlib
from gpudoctor.bench.cell import suspect as suspectlib
@dataclass
class CellWatch:
    cache_policy: str = cachelib.FLUSH
    sample: bool = True
    nvml: object = None  # an NVML-like module (pynvml's functions); None: pynvml, imported when the level starts
    gpus: list[int] | None = None
    interval_s: float = healthlib.DEFAULT_INTERVAL_S
    kernel_log: str | None = healthlib.DEFAULT_KERNEL_LOG
    server_pids: object = None  # a callable giving the server's pids, or None (the processes there at the start)
    thresholds: dict = field(default_factory=lambda: dict(suspectlib.DEFAULTS))
    unavailable: str | None = None  # why this target cannot be sampled from here (then nothing is sampled)
    sampler: object = None  # a callable giving a sampler to start (health.RemoteSampler on a remote target)
    base: dict = field(default_factory=dict)  # provenance the caller knows (campaign, launch command, gate verdict)
    _sampler: object = None
    _cache: dict | None = None
    _counters: dict | None = None
    _server: dict | None = None

    async def before(self, base_url: str) -> None:
        self._cache = await cachelib.before_cell(base_url, self.cache_policy)
        self._server = await provlib.server(base_url)
        self._counters = await counterlib.scrape(base_url)
        self._sampler = None
        if self.sample and self.unavailable is None and self.sampler is not None:
            self._sampler = self.sampler().start()
        elif self.sample and self.unavailable is None:
            self._sampler = healthlib.Sampler(self.nvml, gpus=self.gpus, interval_s=self.interval_s,
                                              kernel_log=self.kernel_log, server_pids=self.server_pids).start()

    def abort(self) -> None:
        """The level did not run after all (stop the sampler, record nothing)."""
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    async def finish(self, base_url: str, rec: dict) -> dict:
        """after(), with the server's counters read again for the level's deltas."""
        later = await counterlib.scrape(base_url) if self._counters is not None else None
        rec = self.after(rec)
        if later is not None:
            rec["server_counters"] = counterlib.section(self._counters, later)
        return rec

    def after(self, rec: dict) -> dict:
        if self._sampler is not None:
            h = self._sampler.stop()
            self._sampler = None
        else:
            h = healthlib.unavailable(self.unavailable or "host health sampling is off (health.sample: false)")
        pids = self.server_pids() if callable(self.server_pids) else self.server_pids
        server = {**(self.base.get("server") or {}), **(self._server or {})}
        if server.get("engine") in (None, "unknown") and provlib.engine_from_command(server.get("command")):
            server["engine"] = provlib.engine_from_command(server["command"])
            server["engine_from"] = "the launch command (the server names itself on none of its endpoints)"
        prov = {**self.base, "server": server,
                "gpu": provlib.gpu(h), "numa": provlib.numa(pids),
                "gpudoctor": {"version": provlib.gpudoctor_version()}}
        return {**rec, "cache": self._cache, "host_health": h, "suspect": suspectlib.judge(h, self.thresholds),
                "provenance": prov}
