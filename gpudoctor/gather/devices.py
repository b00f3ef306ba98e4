"""Device-node facts: every /dev/nvidia* node's type, major:minor, mode, and the errno of a real open()."""

from __future__ import annotations

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

# Nodes CUDA needs even when absent from /dev (so absence is seen).
EXPECTED = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def gather(host: Host, ctx: GatherContext) -> dict:
    t = min(ctx.timeout, 5.0)
    dev = host.listdir("/dev", t)
    names = [n for n in dev if n.startswith("nvidia")] if isinstance(dev, list) else []
    paths = sorted({*(f"/dev/{n}" for n in names), *EXPECTED})
    caps = host.listdir("/dev/nvidia-caps", t) if "nvidia-caps" in names else []
    if isinstance(caps, list):
        paths += [f"/dev/nvidia-caps/{n}" for n in caps]
    stats = host.stat_many(paths, t)
    nodes = [p for p, s in stats.items() if s.kind == "char"]
    # Opening /dev/nvidiaN can take seconds without persistence mode (GPU init): give it the full deadline.
    opens = host.try_open_many(nodes, ctx.timeout) if nodes else {}
    return {
        "listdir_error": dev if isinstance(dev, str) else None,
        "nodes": {p: {**s.to_json(), "open": opens.get(p)} for p, s in stats.items()},
    }
