"""Where a deep run's time goes: each phase's start and end, in seconds since gpudoctor's own process started.

facts["deep"]["timeline"] = {"origin": "gpudoctor's process start", "phases": [{"phase", "start_s", "end_s",
"gpu"?}, ...]}, the parent's phases (the python search, nvidia-smi, each child from its start to its exit, the NCCL
probe) and each child's own (its interpreter's start-up, NVML, importing torch, the CUDA context, each measurement,
its exit), placed on the parent's clock: a child's phases are relative to its own first line, which the parent puts at
the child's start plus the interpreter's start-up the child read from /proc/self/stat (10 ms resolution). `check
--json` shows it as `deep_timeline`. A replay keeps the children's recorded phases; the parent's are the replay's.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager

def started_ago():
    """Seconds since this process was started (exec): /proc/self/stat's start time (clock ticks since boot) against
    the boot clock. The measuring child runs this function's own text (deep_child.PROGRAM), so both read it alike."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return round(time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Timeline:
    """Phases on one clock (time.monotonic, origin: this process's start); thread-safe (probes run in threads)."""

    def __init__(self):
        ago = started_ago()
        self._origin = time.monotonic() - (ago if ago is not None else 0.0)
        self._lock = threading.Lock()
        self.phases: list[dict] = []

    def now(self) -> float:
        return time.monotonic() - self._origin

    def add(self, phase: str, start: float, end: float, **kw) -> None:
        rec = {"phase": phase, "start_s": round(start, 3), "end_s": round(end, 3),
               **{k: v for k, v in kw.items() if v is not None}}
        with self._lock:
            self.phases.append(rec)

    @contextmanager
    def phase(self, phase: str, **kw):
        t = self.now()
        try:
            yield
        finally:
            self.add(phase, t, self.now(), **kw)

    def child(self, started: float, result: dict | None, ended: float | None = None, prefix: str = "",
              **kw) -> None:
        """A child's own phases (result["phases"]: [name, start, end] since its first line; result["startup_s"]: its
        interpreter's start-up), placed after its start at `started` on this clock; from its last phase to `ended`
        (when the parent saw it exit) is its exit (the interpreter's teardown: torch's, the CUDA context's). `prefix`
        names whose phases they are where one GPU has several (an NCCL rank's beside its measuring child's)."""
        if not isinstance(result, dict) or not isinstance(result.get("phases"), list):
            return
        up = result.get("startup_s")
        base = started + (up if isinstance(up, (int, float)) and 0 <= up < 60 else 0.0)
        if isinstance(up, (int, float)):
            self.add(prefix + "interpreter start-up", started, base, **kw)
        last = base
        for p in result["phases"]:
            if isinstance(p, list) and len(p) == 3 and all(isinstance(x, (int, float)) for x in p[1:]):
                self.add(prefix + str(p[0]), base + p[1], base + p[2], **kw)
                last = max(last, base + p[2])
        if ended is not None:  # (the start-up's 10 ms ticks may put the last phase a little after it)
            self.add(prefix + "exit", min(last, ended), ended, **kw)

    def to_json(self) -> dict:
        with self._lock:
            phases = sorted(self.phases, key=lambda p: (p["start_s"], p["end_s"]))
        return {"origin": "gpudoctor's process start", "phases": phases}


def render(timeline: dict) -> list[str]:
    """The timeline as lines (tools/deep_speed_proof.sh prints them): start, end, length, what, GPU."""
    out = []
    for p in (timeline or {}).get("phases") or []:
        gpu = f" GPU {p['gpu']}" if p.get("gpu") is not None else ""
        out.append(f"{p['start_s']:7.3f} {p['end_s']:7.3f} {p['end_s'] - p['start_s']:7.3f}  {p['phase']}{gpu}")
    return out
