"""Build Hosts from the inventory: `--host ct200` → an SSHHost to the container and one to its Proxmox node.

    host_for(entry)              -> Host          (SSHHost, or LocalHost for address: local)
    proxmox_for(entry)           -> Host | None   (the Proxmox node of an LXC host)
    open_host("ct200" | "local") -> Host
    open_target(spec)            -> Target        (host + proxmox + vmid + expectations: what `check` needs)
    connect_all(host, proxmox) / Target.connect()  (both connections, host keys first: refuse before running anything)
    Target.gather_context()      -> GatherContext (name, expectations, Proxmox host, vmid, config_dir, pct)

Nothing connects here: connections open on first use, so building a Target for 100 hosts is instant.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gpudoctor.errors import HostUnreachable, InventoryError
from gpudoctor.host.base import Host

LOCAL_NAMES = ("local", "localhost")


def host_for(entry, *, host_key_policy: str | None = None) -> Host:
    """A Host for a HostEntry or ProxmoxEntry. host_key_policy overrides the inventory (--accept-new-host-key)."""
    s = entry.ssh
    if s.is_local:
        from gpudoctor.host.local import LocalHost

        kw = {"python": list(s.python)} if s.python else {}
        return LocalHost(name=entry.name, root=s.test_root, path_prepend=list(s.test_path), **kw)
    from gpudoctor.host.ssh import SSHHost

    for p in s.identity_files:
        if not os.path.exists(p):
            raise InventoryError(f"{entry.name}: identity_file {p} does not exist", path=entry.source or None,
                                 line=entry.lines.get("identity_file"))
    kw = {"python": list(s.python)} if s.python else {}
    return SSHHost(name=entry.name, address=s.address, port=s.port, user=s.user,
                   identity_files=list(s.identity_files), known_hosts=s.known_hosts,
                   host_key_policy=host_key_policy or s.host_key_policy, connect_timeout=s.connect_timeout,
                   ssh_config=s.ssh_config, root=s.test_root, path_prepend=list(s.test_path), **kw)


def proxmox_for(entry, *, host_key_policy: str | None = None) -> Host | None:
    """The Host of the Proxmox node running this LXC host; None when the host is not an LXC container."""
    if entry.lxc is None:
        return None
    return host_for(entry.lxc.proxmox, host_key_policy=host_key_policy)


@dataclass
class Target:
    """Everything a check of one inventory host needs: its Host, its Proxmox Host, what it should have."""

    name: str
    host: Host
    entry: object = None  # HostEntry, or None for --host local without an inventory entry
    proxmox: Host | None = None
    proxmox_entry: object = None  # ProxmoxEntry: .config_dir, .pct, .config_path(vmid)
    vmid: int | None = None
    expect_gpus: int | None = None
    model_paths: list[str] = field(default_factory=list)

    def connect(self) -> None:
        """Open the target's connection and its Proxmox node's before anything runs on either (connect_all)."""
        connect_all(self.host, self.proxmox)

    def gather_context(self, **kw):
        """The GatherContext a check of this target needs (kw sets further fields, e.g. timeout)."""
        from gpudoctor.gather.context import GatherContext

        ctx = GatherContext(name=self.name, expect_gpus=self.expect_gpus, model_paths=list(self.model_paths),
                            proxmox=self.proxmox, vmid=self.vmid, **kw)
        if self.proxmox_entry is not None:
            ctx.lxc_config_dir = self.proxmox_entry.config_dir
            ctx.pct = list(self.proxmox_entry.pct)
        return ctx

    def close(self) -> None:
        self.host.close()
        if self.proxmox is not None:
            self.proxmox.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect_all(host: Host, proxmox: Host | None = None) -> None:
    """Open a target's connection and its Proxmox node's before anything runs on either.

    An unknown or changed host key on either raises HostKeyError, so nothing runs anywhere. An unreachable target
    raises HostUnreachable; an unreachable Proxmox node does not: the boundary gather then reports it as "could not
    probe" and every other layer is still checked. Hosts without connections (local) are skipped."""
    for h in (host, proxmox):
        fn = getattr(h, "connect", None)
        if fn is None:
            continue
        try:
            fn()
        except HostUnreachable:
            if h is host:
                raise


def open_host(spec: str, inventory=None, *, host_key_policy: str | None = None) -> Host:
    """"local"/"localhost" → this machine (no inventory needed); a name → its inventory entry's Host."""
    return open_target(spec, inventory, host_key_policy=host_key_policy).host


def open_target(spec: str, inventory=None, *, host_key_policy: str | None = None) -> Target:
    """Resolve --host SPEC with an Inventory, an inventory path, or None (the default locations)."""
    from gpudoctor.inventory import Inventory, load_inventory

    if spec in LOCAL_NAMES:
        from gpudoctor.host.local import LocalHost

        return Target(spec, LocalHost(name="localhost"))
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    entry = inv.host(spec)
    px = entry.lxc.proxmox if entry.lxc else None
    return Target(entry.name, host_for(entry, host_key_policy=host_key_policy), entry,
                  proxmox_for(entry, host_key_policy=host_key_policy), px,
                  entry.lxc.vmid if entry.lxc else None, entry.expect.gpus, list(entry.expect.model_paths))
