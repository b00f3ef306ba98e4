"""gather → checks → diagnose, one straight line for every consumer (check, gate, daemon, fleet, bench)."""

from __future__ import annotations

from gpudoctor.diagnose import Diagnosis, diagnose
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host

__all__ = ["Diagnosis", "check_host", "diagnose"]


def check_host(host: Host, ctx: GatherContext | None = None, only_layers: set[str] | None = None) -> Diagnosis:
    """Gather the host's facts once and diagnose them."""
    ctx = ctx or GatherContext(name=host.name)
    return diagnose(gather(host, ctx), only_layers)
