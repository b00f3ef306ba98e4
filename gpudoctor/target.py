"""Open what a command looks at — this machine, an inventory host with its Proxmox node, or a snapshot — by one rule.

    open_target(spec, inventory, ...) -> Target   every consumer: check, snapshot, fix, gate, daemon, fleet, lxc, bench
    host_for(entry)                   -> Host     the transport of one inventory entry (host or Proxmox node)
    local_host()                      -> Host     this machine, for commands gpudoctor runs here (slurm, bench client)
    live(target, doing)               -> LiveTarget  the one door to every action (ReplayRefused for a replay)

The rule (the same for every consumer):
  - the inventory is the one given (an Inventory or a path, e.g. --inventory / $GPUDOCTOR_INVENTORY), else the first
    of ./inventory.yaml and $XDG_CONFIG_HOME/gpudoctor/inventory.yaml; an inventory host needs one, this machine and a
    snapshot use it when there is one (`search=False`: only the given one);
  - expectations come from the inventory entry, then the command line (--expect-gpus, --model);
  - the policy is the snapshot's recorded policy, then the inventory's `policy:` (policy_from_inventory: its
    `checks: fabric.pcie.mrrs: {expect: N}` becomes policy.pcie.mrrs), then the command line (--mrrs, --deep).
Nothing connects here: connections open in Target.connect() (check_host calls it) or on first use, so building
targets for 100 hosts is instant. No other module builds a Host.

A target's type says whether it may act. open_target returns a LiveTarget (facts gathered from a host now) or a
ReplayTarget (facts a snapshot recorded, of another machine or another moment): read-only by type. Every action —
the recovery ladder's writes, a Slurm drain or resume, remedies (fix --apply, the daemon's heals and restages),
release — takes its target through live(), which hands back only a LiveTarget and refuses anything else with
ReplayRefused (exit 3, one line). A command that wants to say what it would have done (gate --snapshot --slurm)
asks `is_live(target)` first and reports instead.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from gpudoctor.errors import HostUnreachable, InputError, InventoryError
from gpudoctor.gather.context import GatherContext, policy_from_inventory
from gpudoctor.host.base import Host

LOCAL_NAMES = ("local", "localhost")


class ReplayRefused(InputError):
    """An action was handed a replayed snapshot: nothing was changed (exit 3)."""


@dataclass
class Target:
    """One thing to check: the Host its facts come from, its boundary host (Proxmox node), its context and policy.
    Only its subclasses are built: LiveTarget (may act) and ReplayTarget (read-only)."""

    name: str  # what reports call it: the inventory name, this machine's host name, or the snapshot's host
    host: Host | None  # the live host (None: a snapshot opened without --host, nothing to act on)
    context: GatherContext
    proxmox: Host | None = None  # the Proxmox node of an LXC guest (or the node itself for a Proxmox spec)
    entry: object = None  # inventory.HostEntry (or ProxmoxEntry for a Proxmox spec), None for this machine
    proxmox_entry: object = None  # inventory.ProxmoxEntry: config_dir, pct, config_path(vmid)
    inventory: object = None  # the inventory.Inventory in effect, if any
    snapshot: dict | None = None  # a loaded snapshot document: facts come from it, not from `host`
    remote: bool = False  # reached over SSH through the inventory
    local_names: tuple[str, ...] = ()  # further names this machine answers to in a remedy plan

    @property
    def vmid(self) -> int | None:
        return self.context.vmid

    def hosts(self) -> dict:
        """Name -> Host for the remedy engine: the target under its names, and its Proxmox node."""
        out = {}
        if self.host is not None:
            # a snapshot of another machine applies to this one only as "localhost"
            own = (self.name,) if self.snapshot is None or self.remote else ()
            for n in (*own, getattr(self.host, "name", None), *self.local_names):
                if n:
                    out.setdefault(n, self.host)
        if self.proxmox is not None:
            out.setdefault(self.proxmox.name, self.proxmox)
        return out

    def connect(self) -> None:
        """Open the target's connection and its Proxmox node's before anything runs on either.

        An unknown or changed host key on either raises HostKeyError, so nothing runs anywhere. An unreachable target
        raises HostUnreachable; an unreachable Proxmox node does not: the boundary gather then reports it as "could
        not probe" and every other layer is still checked. Hosts without connections (local, replay) are skipped."""
        for h in (self.host, self.proxmox):
            fn = getattr(h, "connect", None)
            if fn is None:
                continue
            try:
                fn()
            except HostUnreachable:
                if h is self.host:
                    raise

    def facts(self) -> dict:
        """The target's facts: gathered from the host, or the snapshot's (re-gathered from its transcript)."""
        from gpudoctor.gather import gather

        if self.snapshot is not None:
            return _snapshot_facts(self.snapshot, self.context)
        return gather(self.host, self.context)

    def replayed(self) -> str | None:
        """What a verdict judged when it judged a replay (ReplayTarget.recorded()), None for a live target: the words
        a verdict carries (GateResult.replayed) so that an action on it refuses by the same rule (live_verdict)."""
        if is_live(self):
            return None
        return self.recorded() if isinstance(self, ReplayTarget) else "not a live target"

    def close(self) -> None:
        seen = set()
        for h in (self.host, self.proxmox):
            if h is not None and id(h) not in seen:
                seen.add(id(h))
                try:
                    h.close()
                except Exception:  # noqa: BLE001 - closing must not hide the result
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class LiveTarget(Target):
    """A target whose facts are gathered from its host now: the only kind an action takes (live())."""


@dataclass
class ReplayTarget(Target):
    """A target whose facts are a snapshot's: read-only by type. Its `host`, when one is attached (fix --snapshot
    plans against this machine's files), is read for a plan, never changed through this target."""

    def recorded(self) -> str:
        """What the replay is: its host and when it was recorded, for a refusal's words."""
        when = (self.snapshot or {}).get("created")
        if isinstance(when, (int, float)) and not isinstance(when, bool) and 0 < when < 1e11:
            return f"a snapshot of {self.name} recorded {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(when))}"
        return f"a snapshot of {self.name}"


def is_live(target) -> bool:
    """Whether `target` may act: a LiveTarget (never a ReplayTarget, a bare Target or anything else)."""
    return isinstance(target, LiveTarget) and target.snapshot is None


def live(target, doing: str, hint: str = "") -> LiveTarget:
    """The one door to an action: `target` itself when it is live, else ReplayRefused naming what was refused,
    e.g. live(t, "drain a Slurm node"). Nothing may change a machine on the strength of a replay."""
    if is_live(target):
        return target
    what = target.recorded() if isinstance(target, ReplayTarget) else f"a {type(target).__name__} (not a live target)"
    raise ReplayRefused(f"will not {doing} from {what}: a replay is read-only (its facts are not this machine's "
                        f"now); nothing was changed{'; ' + hint if hint else ''}")


def live_verdict(result, doing: str, hint: str = ""):
    """The door for an action on a verdict (a Slurm drain or resume): the verdict itself when it judged a live
    target, else ReplayRefused."""
    what = getattr(result, "replayed", None)
    if what:
        raise ReplayRefused(f"will not {doing} from {what}: a replay is read-only (its facts are not this machine's "
                            f"now); nothing was changed{'; ' + hint if hint else ''}")
    return result


def open_target(spec: str | None = None, inventory=None, *, snapshot=None, expect_gpus: int | None = None,
                models=(), sglang_url: str | None = None, timeout: float = 10.0, policy: dict | None = None,
                mrrs: int | None = None, host_key_policy: str | None = None, search: bool = True,
                units=()) -> Target:
    """The Target for --host SPEC (None/"local": this machine), optionally planned from a snapshot (a path or a
    loaded document). `policy` adds command-line policy (e.g. {"deep": True}); `mrrs` is `fix --mrrs`; `units` adds
    systemd units to audit (`--unit`)."""
    from gpudoctor import snapshot as snap

    doc = snap.load(snapshot) if isinstance(snapshot, (str, os.PathLike)) else snapshot
    local = spec is None or spec in LOCAL_NAMES
    inv = resolve_inventory(inventory, required=not local, search=search)
    ctx = _recorded_context(doc) if doc is not None else GatherContext(name=socket.gethostname())
    t = (ReplayTarget if doc is not None else LiveTarget)(ctx.name, None, ctx, inventory=inv, snapshot=doc)
    if not local:
        _attach_inventory_host(t, inv, spec, host_key_policy)
    elif doc is None or spec is not None:
        from gpudoctor.host.local import LocalHost

        t.host = LocalHost()
        t.local_names = ("localhost",)
    if doc is None:
        ctx.name = t.name
    if inv is not None or mrrs is not None:
        ctx.policy = {**ctx.policy, **policy_from_inventory(getattr(inv, "policy", None), mrrs=mrrs)}
    ctx.policy.update(policy or {})
    if expect_gpus is not None:
        ctx.expect_gpus = expect_gpus
    if models:
        ctx.model_paths = list(models)
    if sglang_url:
        ctx.sglang_url = sglang_url
    if units:  # systemd units whose device policy the boundary layer audits (check/fix --unit)
        ctx.units = list(dict.fromkeys([*ctx.units, *units]))
    if doc is None:
        ctx.timeout = timeout
    return t


def resolve_inventory(inventory, *, required: bool = True, search: bool = True):
    """The inventory in effect (module docstring); None when none is needed and none is there."""
    from gpudoctor.inventory import ENV_VAR, Inventory, default_locations, is_example, load_inventory

    if isinstance(inventory, Inventory):
        return inventory
    if inventory is not None or required:
        return load_inventory(inventory)
    # an example inventory (`example: true`, the checkout's sample) is never found by the search
    if search and (os.environ.get(ENV_VAR) or any(p.is_file() and not is_example(p) for p in default_locations())):
        return load_inventory(None)
    return None


def _attach_inventory_host(t: Target, inv, spec: str, host_key_policy: str | None) -> None:
    """An inventory host (with its Proxmox node), or a Proxmox node named directly (its own boundary host)."""
    ctx = t.context
    if spec not in inv.hosts and spec in getattr(inv, "proxmox", {}):
        pxe = inv.proxmox_host(spec)
        t.name, t.entry, t.proxmox_entry, t.remote = pxe.name, pxe, pxe, True
        t.host = t.proxmox = host_for(pxe, host_key_policy=host_key_policy)
        ctx.lxc_config_dir, ctx.pct = pxe.config_dir, list(pxe.pct)
        return
    entry = inv.host(spec)
    t.name, t.entry, t.remote = entry.name, entry, not entry.ssh.is_local
    t.host = host_for(entry, host_key_policy=host_key_policy)
    if t.snapshot is None:
        ctx.expect_gpus = entry.expect.gpus
        ctx.model_paths = list(entry.expect.model_paths)
    if entry.lxc is not None:
        pxe = entry.lxc.proxmox
        t.proxmox_entry = pxe
        t.proxmox = host_for(pxe, host_key_policy=host_key_policy)
        if t.snapshot is None:  # a snapshot replays the Proxmox node from its own transcript
            ctx.proxmox, ctx.vmid = t.proxmox, entry.lxc.vmid
            ctx.lxc_config_dir, ctx.pct = pxe.config_dir, list(pxe.pct)


def host_for(entry, *, host_key_policy: str | None = None) -> Host:
    """A Host for an inventory HostEntry or ProxmoxEntry. host_key_policy overrides the inventory (--accept-new-host-key)."""
    s = entry.ssh
    kw = {"python": list(s.python)} if s.python else {}
    if s.is_local:
        from gpudoctor.host.local import LocalHost

        return LocalHost(name=entry.name, **kw)
    from gpudoctor.files.inputs import read_config  # the one door: as root, another user's ssh config is refused
    from gpudoctor.host.ssh import SSHHost

    for p in s.identity_files:
        why = "does not exist" if not os.path.exists(p) else "is a directory, not a key file" if os.path.isdir(p) \
            else None
        if why:
            raise InventoryError(f"{entry.name}: identity_file {p} {why}", path=entry.source or None,
                                 line=entry.lines.get("identity_file"))
    return SSHHost(name=entry.name, address=s.address, port=s.port, user=s.user,
                   identity_files=list(s.identity_files), known_hosts=s.known_hosts,
                   host_key_policy=host_key_policy or s.host_key_policy, connect_timeout=s.connect_timeout,
                   ssh_config=s.ssh_config, read_config=read_config, **kw)


def local_host() -> Host:
    """This machine, for what gpudoctor runs where it runs (scontrol, a bench client, mirrored files)."""
    from gpudoctor.host.local import LocalHost

    return LocalHost()


# --- snapshots --------------------------------------------------------------------------------------------------

def _recorded_context(doc: dict) -> GatherContext:
    """The GatherContext a snapshot was taken with (its Proxmox node replays from the Proxmox transcript)."""
    meta = (doc.get("facts") or {}).get("meta") or {}
    c = dict(doc.get("context") or meta.get("context") or {})
    ctx = GatherContext(name=doc.get("host") or meta.get("host") or "snapshot", expect_gpus=c.get("expect_gpus"),
                        model_paths=list(c.get("model_paths") or []), vmid=c.get("vmid"),
                        policy=dict(c.get("policy") or {}), sglang_url=c.get("sglang_url"),
                        timeout=c.get("timeout") or 10.0, units=list(c.get("units") or []),
                        cdi_dirs=list(c.get("cdi_dirs") or []), oci_state_dirs=list(c.get("oci_state_dirs") or []))
    if c.get("lxc_config_dir"):
        ctx.lxc_config_dir = c["lxc_config_dir"]
    if c.get("pct"):
        ctx.pct = list(c["pct"])
    return ctx


def _snapshot_facts(doc: dict, ctx: GatherContext) -> dict:
    """A snapshot's facts, re-gathered from its raw transcript through today's code when it has one."""
    import copy

    from gpudoctor.gather import gather
    from gpudoctor.host.replay import ReplayHost

    if not isinstance(doc.get("transcript"), dict):
        facts = copy.deepcopy(doc["facts"])
        meta = facts.setdefault("meta", {})
        meta["context"] = {**(meta.get("context") or {}), "policy": dict(ctx.policy),
                           "expect_gpus": ctx.expect_gpus, "model_paths": list(ctx.model_paths)}
        return facts
    rctx = GatherContext(**{k: getattr(ctx, k) for k in ctx.__dataclass_fields__ if k != "proxmox"})
    if isinstance(doc.get("proxmox_transcript"), dict):
        c = doc.get("context") or {}
        rctx.proxmox = ReplayHost(name=c.get("proxmox") or "proxmox", transcript=doc["proxmox_transcript"])
    from gpudoctor.host.replay import Answers

    answers = Answers(doc["transcript"])
    facts = gather(ReplayHost(name=rctx.name, transcript=answers), rctx)
    answers.require_hits(doc)  # a transcript that answered nothing is not "no driver": it cannot be judged
    recorded = ((doc.get("facts") or {}).get("meta") or {}).get("timings")
    facts["meta"]["replay_timings"] = facts["meta"]["timings"]  # this replay's own
    if isinstance(recorded, dict):
        facts["meta"]["recorded_timings"] = recorded
    facts["meta"]["timings"] = recorded if isinstance(recorded, dict) else facts["meta"]["timings"]
    facts["meta"]["replayed_from"] = doc.get("created")
    return facts


def snapshot_facts(doc: dict, regather: bool = True) -> dict:
    """A loaded snapshot's facts: re-gathered from its transcript through today's code when it has one."""
    if not regather or not isinstance(doc.get("transcript"), dict):
        return doc["facts"]
    return open_target(snapshot=doc, search=False).facts()
