"""What a gather needs to know beyond the host itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GatherContext:
    name: str = "localhost"
    expect_gpus: int | None = None
    model_paths: list[str] = field(default_factory=list)
    proxmox: Any = None  # Host of the Proxmox node, for LXC guests
    vmid: int | None = None
    lxc_config_dir: str = "/etc/pve/lxc"  # where the Proxmox host keeps container configs (inventory: config_dir)
    pct: list[str] = field(default_factory=lambda: ["pct"])  # how to run pct there (inventory: pct)
    policy: dict = field(default_factory=dict)
    sglang_url: str | None = None
    units: list[str] = field(default_factory=list)  # systemd units whose device policy to audit (check --unit)
    cdi_dirs: list[str] = field(default_factory=list)  # CDI spec directories (default /etc/cdi, /var/run/cdi)
    oci_state_dirs: list = field(default_factory=list)  # [engine, dir, shape] of OCI runtime state (gather/oci.py)
    timeout: float = 10.0  # deadline of one command or read

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("proxmox")
        d["proxmox"] = getattr(self.proxmox, "name", None)
        return d


def policy_from_inventory(policy=None, *, mrrs: int | None = None) -> dict:
    """GatherContext.policy from the inventory's `policy:` (an inventory.Policy or its dict), in the shape the checks
    read: `checks: fabric.pcie.mrrs: {expect: 512}` becomes policy["pcie"]["mrrs"] = 512 (fabric.pcie.mrrs audits
    against it; fabric.pcie.mrrs's remedy acts only then). `mrrs` (gpudoctor fix --mrrs) overrides the inventory."""
    pol = policy.as_dict() if hasattr(policy, "as_dict") else dict(policy or {})
    want = mrrs
    if want is None:
        exp = ((pol.get("checks") or {}).get("fabric.pcie.mrrs") or {}).get("expect")
        want = int(exp) if isinstance(exp, (int, str)) and str(exp).isdigit() else None
    if want is not None:
        pol["pcie"] = {**(pol.get("pcie") or {}), "mrrs": want}
    py = ((pol.get("checks") or {}).get("fabric.deep.figure") or {}).get("python")
    if isinstance(py, str) and py:  # `checks: fabric.deep.figure: {python: PATH}`: the deep tier's python (#33)
        pol["deep_python"] = py
    return pol
