"""Remedies for /dev/nvidia* nodes: devices.node.create (missing, or a wrong major:minor) and devices.node.mode.

create: with nvidia-modprobe on the target, the driver's own tool makes the node (`nvidia-modprobe -u -c 0` for the
uvm pair, `-c N` for /dev/nvidiaN, `-c 255` for nvidiactl, `-m` for nvidia-modeset); otherwise gpudoctor makes it with
mknod, using the major the LIVE /proc/devices gives at apply time (never a remembered number), mode 0666, under a temp
name renamed over the old node in one step. It refuses — rather than guesses — when the driver registers no such
device (no major to use), when the node is a bind mount (it comes from outside: in an LXC guest, from the Proxmox host),
when the path is a directory, link or non-empty file, and inside an LXC guest that cannot mknod (no CAP_MKNOD in the
initial user namespace): there the fix belongs on the host (`gpudoctor lxc fix`). A process that may not load
kernel modules (no CAP_SYS_MODULE: the daemon's hardened unit) asks systemd to, `systemctl start
modprobe@nvidia_uvm.service`, before nvidia-modprobe makes the uvm nodes.

mode: chmod 0666 (e.g. nvidia-uvm-tools left at 000), refusing nodes that belong to the host of a user namespace.

Both verify by re-reading /proc/devices and stat'ing the nodes on the host and re-running the devices checks; both
roll back to the node states recorded just before apply.
"""

from __future__ import annotations

import re

from gpudoctor.errors import RemedyError
from gpudoctor.findings import Finding
from gpudoctor.remedy import Change, Remedy, RemedyContext

from .common import (bad, command, container_kind, errtext, remove_stale_temps, run_check, target_name, temp_beside,
                     tools, verdict)

ID_CREATE = "devices.node.create"
ID_MODE = "devices.node.mode"
UVM = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
PROC_DEVICES = "/proc/devices"
MODE = 0o666
LOAD_UNIT = "modprobe@nvidia_uvm.service"  # systemd's own template: PID 1 runs `modprobe -abq nvidia_uvm`
OVERFLOW_UID = 65534  # how a user namespace shows ids it does not map (the host's root)


def modprobe_args(path: str) -> list[str] | None:
    """The nvidia-modprobe arguments that make this node, or None when it makes no such node."""
    name = path.rsplit("/", 1)[-1]
    if path in UVM:
        return ["-u", "-c", "0"]  # nvidia_uvm_mknod(0): minor 0 and minor 1 (tools)
    if name == "nvidiactl":
        return ["-c", "255"]
    if m := re.fullmatch(r"nvidia(\d+)", name):
        return ["-c", m.group(1)]
    if name == "nvidia-modeset":
        return ["-m"]
    return None


def modprobe_touches(args: list[str]) -> list[str]:
    """Every node an nvidia-modprobe call may create, remove or chmod (all recorded for rollback)."""
    if "-u" in args:
        return list(UVM)
    if "-m" in args:
        return ["/dev/nvidia-modeset"]
    n = int(args[args.index("-c") + 1])
    return ["/dev/nvidiactl" if n == 255 else f"/dev/nvidia{n}"]


def _live(facts: dict) -> dict:
    return ((facts.get("host") or {}).get("proc_devices") or {}).get("char") or {}


def _describe(path: str, n: dict | None, live: dict) -> str:
    if not n or not n.get("exists"):
        return f"{path}  (missing)"
    if n.get("kind") != "char":
        return f"{path}  {n.get('kind')}" + (f", {n.get('size')} bytes" if n.get("kind") == "file" else "")
    owner = next((name for name, m in live.items() if m == n.get("major")), None)
    return (f"{path}  char {n.get('major')}:{n.get('minor')} mode {n.get('mode', 0):04o}  "
            + (f"(major {n.get('major')} is {owner} in /proc/devices)" if owner
               else f"(major {n.get('major')} is not in /proc/devices)"))


def _pseudo_diff(rows: list[tuple[str, str]], title: str = "/dev") -> str:
    out = [f"--- {title} (before)\n", f"+++ {title} (after)\n"]
    for before, after in rows:
        out.append(f"-{before}\n")
        out.append(f"+{after}\n")
    return "".join(out)


def _bind_mount_reason(path: str, mnt: dict, facts: dict) -> str:
    src = f"{mnt.get('source')}:{mnt.get('root')}" if mnt.get("root") not in (None, "/") else mnt.get("source")
    where = ("the Proxmox host (its node, the lxc.mount.entry / devN: line, `gpudoctor lxc fix`), then restart the "
             "container" if container_kind(facts) == "lxc" else "where it comes from (the host or the container runtime)")
    return (f"{path} is a bind mount ({mnt.get('fstype')} {src}): replacing it here would only hide the mount; "
            f"fix it on {where}")


def _state(st) -> dict:
    """A StatResult as the JSON a rollback needs."""
    return st.to_json() if hasattr(st, "to_json") else dict(st)


def restore_node(host, path: str, before: dict, timeout: float) -> str:
    """Put a node back as it was (missing, a char node, or an empty file); returns what was done."""
    cur = host.stat(path, timeout)
    if not before.get("exists"):
        if cur.exists and cur.kind == "char":
            host.unlink(path, timeout)
            return f"removed {path}"
        return f"{path} already absent"
    kind = before.get("kind")
    if kind == "char":
        want = (before.get("major"), before.get("minor"), before.get("mode"))
        if cur.exists and cur.kind == "char" and (cur.major, cur.minor, cur.mode) == want:
            return f"{path} already {want[0]}:{want[1]}"
        remove_stale_temps(host, path, timeout)
        tmp = temp_beside(path)
        host.mknod(tmp, int(want[0]), int(want[1]), int(want[2]), timeout)
        _rename_or_clean(host, tmp, path, timeout)
        return f"restored {path} as char {want[0]}:{want[1]} mode {want[2]:04o}"
    if kind == "file":
        tmp = temp_beside(path)
        host.write_file(tmp, b"", mode=before.get("mode"), exclusive=True, timeout=timeout)
        _rename_or_clean(host, tmp, path, timeout)
        return f"restored {path} as an empty file"
    raise RemedyError(f"cannot restore {path}: it was a {kind}")


def _rename_or_clean(host, tmp: str, path: str, timeout: float) -> None:
    try:
        host.rename(tmp, path, timeout)
    except BaseException:
        try:
            host.unlink(tmp, timeout)
        except Exception:  # noqa: BLE001 - best effort; the temp name is ours and hidden
            pass
        raise


def regather(host, gpu_minors: list[int], timeout: float) -> dict:
    """The facts the devices checks need, read again from the host: /proc/devices and every /dev/nvidia* node."""
    from gpudoctor.gather import devices as gdev
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.gather.hostinfo import parse_proc_devices

    r = host.read_file(PROC_DEVICES, timeout=timeout)
    return {"host": {"proc_devices": {"error": r.error, **parse_proc_devices(r.text or "")}},
            "devices": gdev.gather(host, GatherContext(name=getattr(host, "name", "host"), timeout=timeout)),
            "driver": {"rc": 0, "gpus": [{"minor": m} for m in gpu_minors]}}


def _can_mknod(facts: dict) -> bool | None:
    caps = tools(facts).get("caps") or {}
    if "mknod" not in caps:
        return None
    return bool(caps["mknod"]) and caps.get("userns") is False


class CreateNodes(Remedy):
    id = ID_CREATE
    summary = "create missing /dev/nvidia* nodes, or replace one whose major:minor is not the live one"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.boundary.nodes import expected_numbers
        from gpudoctor.checks.devices import major, present
        from gpudoctor.checks.host import uvm_loaded

        nodes = (facts.get("devices") or {}).get("nodes")
        if nodes is None:
            return None
        targets: list[str] = []
        for f in bad(run_check(present, facts)) + bad(run_check(major, facts)):
            if f.subject and f.subject not in targets:
                targets.append(f.subject)
        uvm_missing = bool(bad(run_check(uvm_loaded, facts)))
        if uvm_missing and "/dev/nvidia-uvm" not in targets:
            targets.append("/dev/nvidia-uvm")
        if not targets:
            return None
        targets.sort(key=_rank)
        pd = (facts.get("host") or {}).get("proc_devices") or {}
        if pd.get("error"):
            return self.refuse(f"cannot read {PROC_DEVICES} ({pd['error']}): the live majors are unknown, so no node "
                               f"can be made with certainty")
        kind = container_kind(facts)
        can = _can_mknod(facts)
        live = _live(facts)
        if (can is False or kind == "lxc" and can is not True) and not _frontend_live(live):
            # the root cause first: without the driver there is no major to make a node with, whoever makes it
            return self.refuse(f"{', '.join(targets)}: the NVIDIA driver is not loaded ({PROC_DEVICES} has no nvidia "
                               f"device; see host.driver.loaded): these nodes need its major, so load the driver "
                               f"first (creating them here would then also need CAP_MKNOD, which this process lacks)")
        if kind == "lxc" and can is not True:
            return self.refuse(
                f"{', '.join(targets)}: inside this LXC guest device nodes cannot be created (no CAP_MKNOD in the "
                f"initial user namespace); fix the host side: make the node on the Proxmox host (nvidia-modprobe "
                f"-u -c 0), pass it with a devN: line or lxc.mount.entry, allow its major (`gpudoctor lxc fix`) and "
                f"restart the container")
        if can is False:
            return self.refuse(f"{', '.join(targets)}: this user cannot create device nodes here (CAP_MKNOD missing "
                               f"or a user namespace): create them on the host")
        mounts = tools(facts).get("dev_mounts") or {}
        modprobe = command(facts, "nvidia-modprobe")
        skipped: list[str] = []
        steps: list[dict] = []
        want: dict[str, list] = {}
        rows: list[tuple[str, str]] = []
        replacing = False
        for p in targets:
            n = nodes.get(p) or {"exists": False}
            wmaj, wmin, source = expected_numbers(p, live)
            if source == "nvidia" and not _frontend_live(live):
                wmaj = None  # expected_numbers falls back to 195; a node needs the driver's registered major
            args = modprobe_args(p) if modprobe else None
            if wmaj is None:
                if source == "nvidia-uvm" and args and kind not in ("lxc", "docker"):
                    pass  # nvidia-modprobe -u loads nvidia_uvm and then reads its major itself
                elif source == "nvidia":
                    skipped.append(f"{p}: {PROC_DEVICES} has no nvidia device: the NVIDIA driver is not loaded "
                                   f"(see host.driver.loaded); load it first")
                    continue
                elif source:
                    skipped.append(f"{p}: {PROC_DEVICES} has no '{source}' device (its kernel module is not loaded), "
                                   f"so there is no live major to create it with: load the driver first "
                                   f"({'nvidia-modprobe -u' if source == 'nvidia-uvm' else 'modprobe ' + source.replace('-', '_')})")
                    continue
                else:
                    skipped.append(f"{p}: gpudoctor does not know which device number it should have")
                    continue
            if p in mounts:
                skipped.append(_bind_mount_reason(p, mounts[p], facts))
                continue
            k = n.get("kind") if n.get("exists") else None
            if k in ("dir", "link", "block", "other"):
                skipped.append(f"{p} is a {k}: gpudoctor replaces only a missing node, a character node or an empty "
                               f"file; remove it by hand first")
                continue
            if k == "file" and n.get("size"):
                skipped.append(f"{p} is a regular file of {n['size']} bytes: not deleting data; move it away first")
                continue
            replacing = replacing or bool(k)
            want[p] = [wmaj, wmin, source]
            after = (f"{p}  char {wmaj}:{wmin} mode {MODE:04o}  ({wmaj} is {source} in /proc/devices)"
                     if wmaj is not None else f"{p}  char <nvidia-uvm major once loaded>:{wmin} mode {MODE:04o}")
            rows.append((_describe(p, n, live), after))
            if args:
                step = next((s for s in steps if s["kind"] == "modprobe" and s["args"] == args), None)
                if step is None:
                    steps.append({"kind": "modprobe", "args": args, "paths": [p], "touches": modprobe_touches(args)})
                else:
                    step["paths"].append(p)
            else:
                steps.append({"kind": "mknod", "path": p, "minor": wmin, "source": source})
        skipped = _merge(skipped)
        if not steps:
            return self.refuse("; ".join(skipped))
        commands = []
        for s in steps:
            if s["kind"] == "modprobe":
                commands.append(" ".join([modprobe or "nvidia-modprobe", *s["args"]]))
            else:
                p, (wmaj, wmin, _) = s["path"], want[s["path"]]
                tmp = p.rsplit("/", 1)[0] + "/." + p.rsplit("/", 1)[-1] + ".gpudoctor"
                commands.append(f"mknod -m {MODE:o} {tmp} c {wmaj} {wmin} && mv -f {tmp} {p}")
        made = [p for s in steps for p in (s["paths"] if s["kind"] == "modprobe" else [s["path"]])]
        touched = sorted({p for s in steps for p in (s["touches"] if s["kind"] == "modprobe" else [s["path"]])})
        loads = uvm_missing and any(s["kind"] == "modprobe" and "-u" in s["args"] for s in steps)
        summary = ("create " if not replacing else "create or replace ") + ", ".join(made)
        if loads and ((tools(facts).get("caps") or {}).get("sys_module") is False):
            # this process may not load modules (the daemon's unit has no CAP_SYS_MODULE): PID 1 loads it
            if not command(facts, "systemctl"):
                return self.refuse(f"{', '.join(made)}: nvidia_uvm is not loaded and this process may not load kernel "
                                   f"modules (no CAP_SYS_MODULE: a sandboxed unit) nor ask systemd to: load it "
                                   f"(`modprobe nvidia_uvm`) and run again")
            steps.insert(0, {"kind": "load", "module": "nvidia_uvm", "unit": LOAD_UNIT})
            commands.insert(0, f"systemctl start {LOAD_UNIT}")
            summary += f" (loads the nvidia_uvm kernel module through systemd: {LOAD_UNIT})"
        elif loads:
            summary += " (loads the nvidia_uvm kernel module)"
        gpu_minors = sorted({g["minor"] for g in ((facts.get("driver") or {}).get("gpus") or [])
                             if g.get("minor") is not None})
        return Change(ID_CREATE, target_name(facts), summary, diff=_pseudo_diff(rows), commands=commands,
                      risk="medium" if (replacing or loads) else "low", needs_reboot=False,
                      fixes=[f"devices.node.present[{p}]" for p in made] + [f"devices.node.major[{p}]" for p in made],
                      data={"steps": steps, "want": want, "paths": made, "touched": touched, "skipped": skipped,
                            "modprobe": modprobe, "gpu_minors": gpu_minors})

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        from gpudoctor.boundary.nodes import expected_numbers
        from gpudoctor.gather.hostinfo import parse_proc_devices

        d = change.data
        t = ctx.timeout
        before = {p: _state(s) for p, s in host.stat_many(d["touched"], t).items()}
        r = host.read_file(PROC_DEVICES, timeout=t)
        if not r.ok:
            raise RemedyError(f"cannot read {PROC_DEVICES} on {change.host} ({r.error}); nothing was changed")
        live = parse_proc_devices(r.text)["char"]
        changed, done = False, []
        for s in d["steps"]:
            if s["kind"] == "load":
                if "nvidia-uvm" in live:
                    continue
                res = host.run(["systemctl", "start", s["unit"]], timeout=t)
                r = host.read_file(PROC_DEVICES, timeout=t)
                live = parse_proc_devices(r.text)["char"] if r.ok else live
                why = res.describe() if not res.ok else f"{PROC_DEVICES} still has no nvidia-uvm"
                if not res.ok or "nvidia-uvm" not in live:
                    raise RemedyError(f"systemd did not load nvidia_uvm ({why}): `journalctl -u {s['unit']}` says "
                                      f"why; nothing else was changed")
                changed = True
                done.append(f"systemctl start {s['unit']}")
                continue
            if s["kind"] == "modprobe":
                if all(_is_right(before.get(p), *expected_numbers(p, live)[:2]) for p in s["touches"]):
                    continue
                argv = [d.get("modprobe") or "nvidia-modprobe", *s["args"]]
                res = host.run(argv, timeout=t)
                if not res.ok:
                    raise RemedyError(f"{res.describe()}; nodes before: "
                                      + ", ".join(_describe(p, before.get(p), live) for p in s["touches"]))
                changed = True
                done.append(" ".join(argv))
                continue
            p = s["path"]
            wmaj, wmin, source = expected_numbers(p, live)
            if source == "nvidia" and not _frontend_live(live):
                wmaj = None
            planned = d["want"][p]
            if wmaj is None:
                raise RemedyError(f"{PROC_DEVICES} on {change.host} no longer lists {source}: not creating {p}")
            if wmaj != planned[0]:
                raise RemedyError(f"the live {source} major is now {wmaj}, the plan said {planned[0]} (the driver was "
                                  f"reloaded?): nothing was changed for {p}; plan again")
            if _is_right(before.get(p), wmaj, wmin):
                continue
            remove_stale_temps(host, p, t)  # a node a killed run made and never renamed into place
            tmp = temp_beside(p)
            try:
                host.mknod(tmp, wmaj, wmin, MODE, t)
                _rename_or_clean(host, tmp, p, t)
            except OSError as exc:
                raise RemedyError(f"cannot create {p} as c {wmaj}:{wmin}: {errtext(exc)}") from exc
            changed = True
            done.append(f"mknod {p} c {wmaj} {wmin} (mode {MODE:04o}, renamed into place)")
        return {"changed": changed, "before": before, "done": done}

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.checks.devices import major, present

        facts = regather(host, change.data.get("gpu_minors") or [], ctx.timeout)
        paths = set(change.data["paths"])
        found = [f for f in run_check(present, facts) + run_check(major, facts) if f.subject in paths]
        missing = paths - {f.subject for f in found if f.id == "devices.node.major"}
        for p in sorted(missing):  # a node major() did not report on is not a char node with known numbers
            n = (facts["devices"]["nodes"].get(p)) or {}
            if not n.get("exists") or n.get("kind") != "char":
                found.append(Finding("devices.node.present", "fail", f"{p} still missing after the change", subject=p,
                                     evidence=[f"stat {p} → {n.get('error') or n.get('kind')}"]))
        return verdict(found, "devices.node.major", f"{', '.join(sorted(paths))}: present with the live major:minor",
                       "the nodes are still wrong")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        if not applied.get("changed"):
            return {"changed": False}
        done = [restore_node(host, p, b, ctx.timeout) for p, b in sorted((applied.get("before") or {}).items())]
        return {"changed": True, "restored": done}


def _merge(reasons: list[str]) -> list[str]:
    """"/dev/a: why" and "/dev/b: why" → "/dev/a, /dev/b: why" (the uvm pair usually shares its reason)."""
    out: dict[str, list[str]] = {}
    for r in reasons:
        path, sep, why = r.partition(": ")
        if sep and path.startswith("/dev/") and " " not in path:
            out.setdefault(why, []).append(path)
        else:
            out.setdefault(r, [])
    return [f"{', '.join(ps)}: {why}" if ps else why for why, ps in out.items()]


def _frontend_live(live: dict) -> bool:
    return any(n in live for n in ("nvidia-frontend", "nvidia", "nvidiactl"))


def _rank(path: str) -> tuple:
    """Control node, GPU nodes, modeset, the uvm pair, the rest: the order the driver's own tools make them."""
    name = path.rsplit("/", 1)[-1]
    m = re.fullmatch(r"nvidia(\d+)", name)
    order = (0 if name == "nvidiactl" else 1 if m else 2 if name == "nvidia-modeset" else 3 if path in UVM else 4)
    return order, int(m.group(1)) if m else 0, path


def _is_right(st: dict | None, wmaj, wmin) -> bool:
    return bool(st and st.get("exists") and st.get("kind") == "char" and wmaj is not None
                and (st.get("major"), st.get("minor")) == (wmaj, wmin))


class NodeMode(Remedy):
    id = ID_MODE
    summary = "chmod 0666 the /dev/nvidia* nodes that others cannot open"

    def plan(self, facts: dict, ctx: RemedyContext) -> Change | None:
        from gpudoctor.checks.devices import major
        from gpudoctor.checks.devices import mode as mode_check

        nodes = (facts.get("devices") or {}).get("nodes")
        if nodes is None:
            return None
        findings = bad(run_check(mode_check, facts))
        if not findings:
            return None
        replaced = {f.subject for f in bad(run_check(major, facts))}  # devices.node.create makes them anew, 0666
        caps = tools(facts).get("caps") or {}
        mounts = tools(facts).get("dev_mounts") or {}
        lxc = container_kind(facts) == "lxc"
        paths, skipped, rows = [], [], []
        for f in findings:
            p, n = f.subject, nodes.get(f.subject) or {}
            if p in replaced:
                continue
            if caps.get("userns") and n.get("uid") == OVERFLOW_UID:
                skipped.append(f"{p} belongs to the host (uid {OVERFLOW_UID} in this user namespace): chmod it on the "
                               f"host")
                continue
            if lxc and p in mounts:
                skipped.append(f"{p} is the host's node (bind mount): chmod it on the Proxmox host")
                continue
            paths.append(p)
            via = f" (bind mount of {mounts[p].get('source')}:{mounts[p].get('root')}: its inode changes)" if p in mounts \
                else ""
            rows.append((f"{p}  char {n.get('major')}:{n.get('minor')} mode {n.get('mode', 0):04o}",
                         f"{p}  char {n.get('major')}:{n.get('minor')} mode {MODE:04o}{via}"))
        if not paths:
            return self.refuse("; ".join(skipped)) if skipped else None
        summary = "chmod 0666 " + ", ".join(paths)
        return Change(ID_MODE, target_name(facts), summary, diff=_pseudo_diff(rows),
                      commands=[f"chmod {MODE:04o} {p}" for p in paths], risk="low",
                      fixes=[f"devices.node.mode[{p}]" for p in paths],
                      data={"paths": paths, "modes": {p: (nodes.get(p) or {}).get("mode") for p in paths},
                            "skipped": skipped})

    def apply(self, host, change: Change, ctx: RemedyContext) -> dict:
        before, changed = {}, []
        for p, st in host.stat_many(change.data["paths"], ctx.timeout).items():
            if not st.exists or st.kind != "char":
                raise RemedyError(f"{p} is no longer a character node ({st.error or st.kind}): plan again")
            before[p] = st.mode
            if st.mode == MODE:
                continue
            try:
                host.chmod(p, MODE, ctx.timeout)
            except OSError as exc:
                raise RemedyError(f"chmod {MODE:04o} {p}: {errtext(exc)}") from exc
            changed.append(p)
        return {"changed": bool(changed), "before": before, "chmodded": changed}

    def verify(self, host, change: Change, ctx: RemedyContext) -> Finding:
        from gpudoctor.checks.devices import mode as mode_check

        paths = change.data["paths"]
        stats = host.stat_many(paths, ctx.timeout)
        facts = {"devices": {"nodes": {p: s.to_json() for p, s in stats.items()}}}
        found = [f for f in run_check(mode_check, facts) if f.subject in paths]
        return verdict(found, "devices.node.mode", f"{', '.join(paths)}: mode 0666", "the modes are still wrong")

    def rollback(self, host, change: Change, ctx: RemedyContext, applied: dict) -> dict:
        done = []
        for p in applied.get("chmodded") or []:
            old = (applied.get("before") or {}).get(p)
            if old is not None:
                host.chmod(p, old, ctx.timeout)
                done.append(f"chmod {old:04o} {p}")
        return {"changed": bool(done), "restored": done}
