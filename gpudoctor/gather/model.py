"""Gather the `model` facts for ctx.model_paths: one stdlib python program on the target (local or over SSH).

The program is gpudoctor/model/probe.py itself, sent as `python3 -c SOURCE ARGS`; it verifies each path by its
safetensors headers (no tensor data read), finds its mount and room, reads the staging marker, the persistent stage
record, the boot id, /proc/meminfo and the memory cgroup. Facts shape: see docs/model.md ("Facts").
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from gpudoctor.files import trust as _trust
from gpudoctor.model import probe as _probe
from gpudoctor.host.childpy import python_argv


@lru_cache(maxsize=1)
def _source() -> str:
    """probe.py's text with files/trust.py's (the one door it opens files through) before its main block: one
    standalone program whose first line is still probe.py's (a replay knows a probe by it)."""
    text, door = Path(_probe.__file__).read_text(), Path(_trust.__file__).read_text()
    start = text.index("\n" + _probe.DOOR_IMPORT) + 1  # its import of the door: the door's own text takes its place
    text = text[:start] + text[text.index("    pass\n", start) + len("    pass\n"):]
    at = text.index('\nif __name__ == "__main__":')
    return text[:at] + "\n" + door + text[at:]


def gather(host, ctx) -> dict:
    """The "model" facts: {"schema", "boot_id", "now", "meminfo", "cgroup", "paths": [...], "error", ...}."""
    paths = [str(p) for p in (getattr(ctx, "model_paths", None) or [])]
    if not paths:
        return {"schema": _probe.SCHEMA, "paths": [], "error": None}
    timeout = float(getattr(ctx, "timeout", None) or 10.0)
    # The program maps absolute paths as the host's file operations do (Host._path: tests root a host in a temp dir).
    args = {"paths": paths, "root": host._path("/")[:-1]}
    res = host.run(python_argv(host.python, "-c", _source(), json.dumps(args)), timeout=timeout)
    probe_meta = {"rc": res.rc, "duration_s": round(res.duration_s, 4), "timed_out": res.timed_out}
    if res.timed_out:
        return _failed(paths, f"the model probe did not answer in {timeout:g} s", probe_meta)
    if res.rc != 0:
        err = (res.stderr.strip().splitlines() or [""])[-1][:300]
        return _failed(paths, f"the model probe ({host.python[0]}) exited {res.rc}: {err}", probe_meta)
    try:
        facts = json.loads(res.stdout)
    except ValueError:
        return _failed(paths, "the model probe printed no JSON", probe_meta)
    facts["error"] = None
    facts["probe"] = probe_meta
    return facts


def _failed(paths: list[str], error: str, meta: dict) -> dict:
    return {"schema": _probe.SCHEMA, "paths": [{"path": p} for p in paths], "error": error, "probe": meta}
