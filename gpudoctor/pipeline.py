"""target → gather → checks → diagnose, one straight line for every consumer (check, gate, fix, daemon, fleet, lxc, bench)."""

from __future__ import annotations

from gpudoctor.diagnose import Diagnosis, diagnose

__all__ = ["Diagnosis", "check_host", "diagnose"]


def check_host(target, only_layers: set[str] | None = None) -> Diagnosis:
    """Connect (host keys first), gather the target's facts once (or replay its snapshot) and diagnose them."""
    target.connect()
    return diagnose(target.facts(), only_layers)
