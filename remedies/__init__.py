"""The remedy registry: every remedy gpudoctor knows, by id, loaded lazily.

A remedy module defines one class derived from gpudoctor.remedy.Remedy; add it here as "id": "module:Class".
"""

from __future__ import annotations

import fnmatch
import importlib

# Registry order is the order `gpudoctor fix` applies changes in: host-side config first, then device nodes, their
# modes, the driver's persistence, sysctls, PCIe registers, the model (it needs a working host), and servers left by
# the bench last.
REMEDIES: dict[str, str] = {
    "lxc.cgroup_allow": "gpudoctor.remedies.lxc_cgroup:LxcCgroupAllow",
    "cdi.spec": "gpudoctor.remedies.cdi:CdiSpec",
    "systemd.device_allow": "gpudoctor.remedies.systemd_unit:SystemdDeviceAllow",
    "devices.node.create": "gpudoctor.remedies.devnodes:CreateNodes",
    "devices.node.mode": "gpudoctor.remedies.devnodes:NodeMode",
    "driver.persistence": "gpudoctor.remedies.persistence:Persistence",
    "fabric.numa.balancing": "gpudoctor.remedies.sysctl:NumaBalancing",
    "fabric.pcie.mrrs": "gpudoctor.remedies.pcie:PcieMrrs",
    "model.stage": "gpudoctor.remedies.model_stage:ModelStage",
    "workload.bench.orphan": "gpudoctor.remedies.bench_orphans:StopOrphanServers",
}


def get(remedy_id: str):
    """A fresh instance of one remedy (KeyError names the known ids)."""
    try:
        target = REMEDIES[remedy_id]
    except KeyError:
        raise KeyError(f"unknown remedy {remedy_id!r}; known: {', '.join(sorted(REMEDIES))}") from None
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)()


def all_remedies(only: list[str] | None = None) -> list:
    """Fresh instances of every remedy (or of those named in `only`), in registry order."""
    return [get(rid) for rid in REMEDIES if only is None or rid in only]


def for_finding(finding_id: str) -> list[str]:
    """Ids of the remedies whose `fixes` patterns cover a finding id."""
    return [r.id for r in all_remedies() if any(fnmatch.fnmatchcase(finding_id, p) for p in r.fixes)]
