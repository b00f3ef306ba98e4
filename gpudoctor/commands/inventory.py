"""`gpudoctor inventory show|ping`: see what the inventory says, and whether every host answers over SSH."""

from __future__ import annotations

import json
import sys
import time

import click

from gpudoctor.errors import EXIT_OK, EXIT_UNKNOWN, GpudoctorError
from gpudoctor.options import Count

inventory_option = click.option(
    "--inventory", "inventory_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
    help="Inventory file (default: $GPUDOCTOR_INVENTORY, ./inventory.yaml, ~/.config/gpudoctor/inventory.yaml).")


@click.group("inventory")
def inventory():
    """Show and test the inventory of hosts.

    \b
    Examples:
      gpudoctor inventory show                     hosts, Proxmox nodes, profiles, policy
      gpudoctor inventory show --json              the validated inventory as JSON
      gpudoctor inventory ping                     connect to every host and Proxmox node
      gpudoctor inventory ping ct200 @h200         some hosts (names, patterns, @group)
      gpudoctor inventory ping --accept-new-host-key   trust unknown host keys on first use

    Exit codes: 0 ok, 3 bad inventory or a host that could not be reached.
    """


@inventory.command("show")
@inventory_option
@click.option("--json", "as_json", is_flag=True, help="Print the validated inventory as JSON.")
def show(inventory_path, as_json):
    """Print the resolved inventory: hosts, Proxmox nodes, profiles and policy.

    Exit codes: 0 shown, 3 bad inventory.
    """
    from gpudoctor.inventory import load_inventory

    from gpudoctor.gate import BUILTIN_PROFILES, known_profiles, profile_from
    from gpudoctor.inventory import source_line

    inv = load_inventory(inventory_path)
    profiles = [(name, where, profile_from(name, inv.profiles[name] if where.startswith("inventory") else
                                           BUILTIN_PROFILES[name], inv.path))
                for name, where in known_profiles(inv.profiles)]
    if as_json:
        doc = {"schema": "gpudoctor.inventory/1", "path": inv.path, "example": inv.example, **inv.to_json(),
               "gate_profiles": {n: {"source": w, **_profile_json(p)} for n, w, p in profiles}}
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        raise SystemExit(EXIT_OK)
    click.echo(source_line(inv))
    click.echo("")
    hosts = [(h.name, _addr(h.ssh), h.ssh.user or "(ssh config)",
              f"{h.lxc.vmid or '?'}@{h.lxc.proxmox.name}" if h.lxc else "-",
              _expect(h.expect), ",".join(h.groups) or "-") for h in inv.hosts.values()]
    _table(f"Hosts ({inv.path})", ("NAME", "ADDRESS", "USER", "LXC", "EXPECT", "GROUPS"), hosts)
    if inv.proxmox:
        rows = [(p.name, _addr(p.ssh), p.ssh.user or "(ssh config)", p.config_dir, " ".join(p.pct))
                for p in inv.proxmox.values()]
        _table("Proxmox nodes", ("NAME", "ADDRESS", "USER", "CONFIG DIR", "PCT"), rows)
    # every profile `gate --profile` accepts, from the list its errors name (gpudoctor.gate.known_profiles)
    _table("Gate profiles", ("PROFILE", "FROM", "REQUIRES"), [(n, w, _profile_text(p)) for n, w, p in profiles])
    pol = inv.policy
    if pol.auto_apply or pol.never_apply or pol.budgets or pol.checks:
        rows = [("auto_apply", " ".join(pol.auto_apply) or "-"), ("never_apply", " ".join(pol.never_apply) or "-"),
                ("budgets", " ".join(f"{k}={v}" for k, v in pol.budgets.items()) or "-"),
                ("checks", " ".join(sorted(pol.checks)) or "-")]
        _table("Remedy policy", ("POLICY", "VALUE"), rows)
    raise SystemExit(EXIT_OK)


@inventory.command("ping")
@click.argument("specs", nargs=-1)
@inventory_option
@click.option("--accept-new-host-key", is_flag=True,
              help="Trust and record unknown SSH host keys (never a changed one).")
@click.option("--parallel", type=Count(1, 256), default=16, show_default=True,
              help="Hosts contacted at once.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per target.")
def ping(specs, inventory_path, accept_new_host_key, parallel, as_json):
    """Connect to hosts (and their Proxmox nodes) over SSH and run `uname -n`.

    SPECS are host names, fnmatch patterns ("ct2*"), groups ("@h200") or "all" (the default).
    Unknown or changed host keys are refused unless --accept-new-host-key (unknown keys only).

    Exit codes: 0 every target answered, 3 bad inventory or a target that could not be reached (unknown).
    """
    from concurrent.futures import ThreadPoolExecutor

    from gpudoctor.inventory import load_inventory
    from gpudoctor.target import host_for

    from gpudoctor.commands import say_inventory

    inv = load_inventory(inventory_path)
    say_inventory(inv)
    entries = inv.select(",".join(specs) if specs else "all")
    targets = {("host", e.name): e for e in entries}
    for e in entries:
        if e.lxc is not None:
            targets.setdefault(("proxmox", e.lxc.proxmox.name), e.lxc.proxmox)
    if not specs:
        for p in inv.proxmox.values():
            targets.setdefault(("proxmox", p.name), p)
    policy = "accept-new" if accept_new_host_key else None

    def one(item):
        (role, name), entry = item
        t0 = time.perf_counter()
        try:
            with host_for(entry, host_key_policy=policy) as h:
                r = h.run(["uname", "-n"], timeout=10)
            ok = r.ok
            detail = r.stdout.strip() if ok else r.describe()
        except GpudoctorError as exc:
            ok, detail = False, exc.one_line()
        # `host`, as the fleet's JSON names a target; `name` kept for the scripts that read it (same value)
        return {"schema": "gpudoctor.inventory-ping/1", "role": role, "host": name, "name": name, "ok": ok,
                "ms": round((time.perf_counter() - t0) * 1000), "detail": detail}

    from gpudoctor.progress import Waiting

    def each(item, waiting):
        r = one(item)
        waiting.done(item[0][1])
        return r

    with Waiting("inventory ping", [name for _role, name in targets]) as waiting:
        pool = ThreadPoolExecutor(max_workers=parallel)
        try:
            results = list(pool.map(lambda item: each(item, waiting), targets.items()))
        finally:  # Ctrl-C: do not wait here for a worker still in its connect timeout (the CLI exits 130 at once)
            pool.shutdown(wait=False, cancel_futures=True)
    if as_json:
        for r in results:
            click.echo(json.dumps(r, sort_keys=True))
    else:
        from gpudoctor.conventions import settings

        quiet = settings().quiet  # -q: only what is not ok, and one line when every target answered
        shown = [r for r in results if not (quiet and r["ok"])]
        rows = [(r["host"], r["role"], "ok" if r["ok"] else "FAIL", f"{r['ms']} ms", r["detail"]) for r in shown]
        if rows:
            _table("SSH reachability", ("HOST", "ROLE", "STATUS", "TIME", "ANSWER"), rows)
        if quiet:
            bad = len(results) - sum(r["ok"] for r in results)
            click.echo(f"{bad} of {len(results)} targets did not answer" if bad else
                       f"all {len(results)} targets answered")
    raise SystemExit(EXIT_OK if all(r["ok"] for r in results) else EXIT_UNKNOWN)


def _profile_json(p) -> dict:
    return {"require": list(p.require), "ignore": list(p.ignore), "fail_free": p.fail_free,
            "max_foreign_mib": p.max_foreign_mib, "free_port": p.free_port}


def _profile_text(p) -> str:
    parts = [*p.require, *(f"!{i}" for i in p.ignore)]
    if not p.require and not p.ignore:
        parts.append("no failure" if p.fail_free else "nothing")
    elif p.fail_free:
        parts.append("and no failure")
    if p.max_foreign_mib is not None:
        parts.append(f"max_foreign_mib={p.max_foreign_mib}")
    if p.free_port:
        parts.append("free_port")
    return " ".join(parts)


def _addr(s) -> str:
    return s.address if s.port is None or s.is_local else f"{s.address}:{s.port}"


def _expect(e) -> str:
    parts = []
    if e.gpus is not None:
        parts.append(f"{e.gpus} GPU{'' if e.gpus == 1 else 's'}")
    parts += list(e.model_paths)
    return ", ".join(parts) or "-"


def _table(title: str, header: tuple, rows: list) -> None:
    """rich on a terminal, plain aligned columns otherwise (pipes, CI logs)."""
    if sys.stdout.isatty():
        from rich.table import Table

        from gpudoctor.report import console, esc

        t = Table(title=esc(title), title_justify="left")
        for h in header:
            t.add_column(h)
        for r in rows:
            t.add_row(*(esc(c) for c in r))
        console().print(t)
        return
    from gpudoctor.report import line

    title, header, rows = line(title), tuple(map(line, header)), [tuple(map(line, r)) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    click.echo(title)
    for r in (header, *rows):
        click.echo("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    click.echo("")
