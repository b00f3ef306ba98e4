"""CDI facts: every spec file in /etc/cdi and /var/run/cdi (raw text, so a snapshot replays and a remedy diffs against
it), a stat of each host node the specs name, and whether nvidia-ctk (the toolkit's spec generator) is on PATH.

facts["cdi"] = {
  "dirs": {"/etc/cdi": ["nvidia.yaml"] | "ENOENT", ...},
  "specs": [{"path": ..., "text": ... | None, "error": None | "EACCES" | "TOO_LARGE"}],
  "host_nodes": {"/dev/nvidia-uvm": StatResult JSON, ...},
  "nvidia_ctk": "/usr/bin/nvidia-ctk" | None,
}
"""

from __future__ import annotations

from gpudoctor.boundary import cdi
from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

_WHICH = 'PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"; command -v nvidia-ctk || true'


def spec_dirs(ctx: GatherContext) -> list[str]:
    return list(getattr(ctx, "cdi_dirs", None) or cdi.SPEC_DIRS)


def gather(host: Host, ctx: GatherContext) -> dict:
    t = min(ctx.timeout, 3.0)
    dirs = spec_dirs(ctx)
    listings = dict(zip(dirs, host.batch([("listdir", d) for d in dirs], t)))
    paths = [f"{d.rstrip('/')}/{n}" for d in dirs if isinstance(listings[d], list)
             for n in listings[d] if n.endswith(cdi.SPEC_SUFFIXES)]
    out: dict = {"dirs": listings, "specs": [], "host_nodes": {}, "nvidia_ctk": None}
    if not paths:
        return out
    reads = host.batch([("read", p, cdi.MAX_BYTES + 1) for p in paths], t)
    nodes: set[str] = set()
    for p, r in zip(paths, reads):
        text = None if r.data is None else r.data.decode("utf-8", "surrogateescape")
        err = r.error or ("TOO_LARGE" if text is not None and len(r.data) > cdi.MAX_BYTES else None)
        out["specs"].append({"path": p, "text": None if err else text, "error": err})
        if text is not None and not err:
            try:
                nodes.update(e.node for e in cdi.parse(p, text).entries)
            except cdi.SpecError:
                pass
    if nodes:
        out["host_nodes"] = {p: s.to_json() for p, s in host.stat_many(sorted(nodes), t).items()}
    res = host.run(["sh", "-c", _WHICH], timeout=t)
    out["nvidia_ctk"] = (res.stdout.strip().splitlines() or [None])[0] if res.ok else None
    return out
