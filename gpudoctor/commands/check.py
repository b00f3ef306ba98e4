"""`gpudoctor check`, `gpudoctor snapshot`, `gpudoctor checks`."""

from __future__ import annotations

import os
import sys

import click

from gpudoctor.conventions import alias, settings
from gpudoctor.errors import InputError
from gpudoctor.exitcodes import EXIT_OK
from gpudoctor.findings import LAYERS
from gpudoctor.files.inputs import http_url, output_file
from gpudoctor.options import Count, seconds


def _console():
    """The fleet table's rich console: a terminal's width; to a pipe no folding (one host, one line: #41)."""
    from gpudoctor.report import console

    return console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 10000)


def _styled():
    """The writer of check's text report (no rich): a terminal's width; to a pipe, one line per finding."""
    from gpudoctor.report import writer

    return writer()


def open_check_target(host_name, inventory, expect_gpus, models, sglang_url, timeout, snapshot_path=None, deep=False,
                      deep_python=None, units=(), deep_force=False, quiet=False):
    """The Target of check/snapshot/gate: this machine, an inventory host (and its Proxmox node) or a snapshot; the
    inventory it read is named on stderr (unless quiet: NPD's one line)."""
    from gpudoctor.commands import say_inventory
    from gpudoctor.target import LOCAL_NAMES, open_target

    if snapshot_path:  # judged as it was recorded: a flag asking for more would be silently ignored
        from gpudoctor.snapshot import refuse_live_flags

        refuse_live_flags(host_name, models, sglang_url)
    if sglang_url:
        http_url(sglang_url, "--sglang-url")
    if deep_force and not deep:
        raise InputError("--force only applies to --deep (measure a GPU another process holds)")
    if deep_python and "/" in deep_python and not os.path.isabs(deep_python) and host_name in (None, *LOCAL_NAMES):
        deep_python = os.path.abspath(deep_python)  # this machine's children start in /: resolved where it was typed
    policy = {"deep": True, **({"torch_python": deep_python} if deep_python else {}),
              **({"deep_force": True} if deep_force else {})} if deep else None
    target = open_target(None if snapshot_path else host_name, inventory, snapshot=snapshot_path,
                         expect_gpus=expect_gpus, models=models, sglang_url=sglang_url, timeout=timeout, policy=policy,
                         units=units)
    if not quiet:
        say_inventory(target)
    return target


_common = [
    click.option("--host", "host_name", metavar="NAME", help="Inventory host to check over SSH (default: this machine)."),
    click.option("--inventory", type=click.Path(dir_okay=False), envvar="GPUDOCTOR_INVENTORY",
                 help="Inventory file (default: ./inventory.yaml, then ~/.config/gpudoctor/inventory.yaml)."),
    click.option("--expect-gpus", type=Count(0, 1024), help="Number of GPUs this host must show."),
    click.option("--model", "models", multiple=True, metavar="PATH", help="Model directory that must be complete (repeatable)."),
    click.option("--sglang-url", metavar="URL", help="Also probe a running SGLang server, e.g. http://127.0.0.1:30000."),
    click.option("--timeout", type=seconds(0.1, 600), default=10.0, show_default=True,
                 help="Deadline in seconds for each command or read; a hang becomes an 'unknown' finding."),
]


def common(f):
    for opt in reversed(_common):
        f = opt(f)
    return f


@click.command("check")
@common
@click.option("--snapshot", "snapshot_path", type=click.Path(dir_okay=False), help="Diagnose a saved snapshot instead of a live host.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (schema: docs/json-schema.md).")
@click.option("-o", "--output", "output_format", type=click.Choice(["text", "json"]), default=None, metavar="FORMAT",
              help="text (the default) or json: `-o json` is --json, as kubectl spells it.")
@click.option("--only", "only", multiple=True, type=click.Choice(LAYERS), help="Show only this layer (repeatable).")
@click.option("--explain", "explain", metavar="ID", help="Explain one check id and exit.")
@alias("-a", "--all-findings", "--verbose-findings", "show_all", hidden_aliases=["--verbose-findings"], is_flag=True,
       help="List every finding (each subject of a healthy row) with its evidence. Not --all: every host.")
@click.option("--deep", is_flag=True, help="Also measure each GPU against its physical limit (host and device copies, "
              "bf16 GEMM, P2P; <= 30 s per GPU) and NCCL all-reduce per TP group (occupies the GPUs; torch, else "
              "CUDA through ctypes).")
@click.option("--deep-python", metavar="PATH", help="Python with torch for --deep (default: the first with torch of a "
              "running SGLang/vLLM/transformers server's, the inventory's, python3 on PATH; docs/deep.md).")
@click.option("--force", "deep_force", is_flag=True,
              help="With --deep: also measure a GPU another process holds (the figures then include its load).")
@click.option("--all", "all_hosts", is_flag=True, help="Check every inventory host, concurrently (fleet mode).")
@click.option("--group", "groups", multiple=True, metavar="G", help="Check the inventory hosts of group G (repeatable).")
@click.option("--parallel", type=Count(1, 1024), default=32, show_default=True,
              help="Fleet mode: hosts checked at once.")
@click.option("--unit", "units", multiple=True, metavar="UNIT",
              help="Also audit this systemd unit's DevicePolicy=/DeviceAllow= (repeatable), e.g. sglang.service.")
@click.option("--host-timeout", type=seconds(1, 86400), default=300.0, show_default=True, metavar="SECONDS",
              help="Fleet mode: a host that has not answered by then is reported unreachable (its own deadline).")
@click.option("--prom", "prom_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write Prometheus text (node_exporter textfile collector), atomically.")
def check(host_name, inventory, expect_gpus, models, sglang_url, timeout, snapshot_path, as_json, only, explain, show_all,
          deep, deep_python, deep_force, all_hosts, groups, parallel, host_timeout, prom_path, units=(),
          output_format=None):
    """Diagnose a GPU host layer by layer and name the root cause with evidence.

    \b
    Layers, bottom-up (a failure marks the layers above as its symptoms):
      host → driver → devices → boundary (LXC, CDI, container, systemd unit) → cuda → fabric → workload

    \b
    Examples:
      gpudoctor check                                   this machine
      gpudoctor check --host ct200                      an inventory host (and its Proxmox node) over SSH
      gpudoctor check --snapshot examples/h200-uvm-blocked.json
      gpudoctor check --json | jq .root_cause
      gpudoctor check --explain devices.node.major
      gpudoctor check --unit sglang.service             also audit a systemd unit's DeviceAllow=
      gpudoctor check --all --parallel 32               every inventory host, one line each (--json: one record each)
      gpudoctor check --group h200 --prom /var/lib/node_exporter/textfile/gpudoctor.prom

    Exit codes (Nagios): 0 ok, 1 warning, 2 failure, 3 unknown (could not probe) or bad input.
    """
    if output_format == "json":
        as_json = settings().json = True
    if explain:
        raise SystemExit(_explain(explain, as_json))
    if prom_path:
        output_file(prom_path, "--prom file")  # before anything runs: a typo in the path is not found an hour later
    if all_hosts or groups:
        if snapshot_path or host_name:
            raise InputError("--all/--group check inventory hosts; they do not combine with --snapshot or --host")
        raise SystemExit(_check_fleet(inventory, all_hosts, groups, parallel, timeout, as_json, prom_path,
                                      host_timeout))
    from gpudoctor.pipeline import check_host

    if not snapshot_path:
        _warm_imports(as_json)
    with open_check_target(host_name, inventory, expect_gpus, models, sglang_url, timeout, snapshot_path, deep,
                           deep_python, units=units, deep_force=deep_force) as target:
        d = check_host(target, set(only) or None)
        triage = None
        if not as_json and any(f.remedy for f in d.root_causes):  # what fix would do, asked while connected
            from gpudoctor.remedy import check_triage

            triage = check_triage(d, target, timeout=timeout)
    facts = d.facts
    if prom_path:
        import time

        from gpudoctor.integrations.promfile import write_prom

        total = (facts.get("meta") or {}).get("timings", {}).get("total")
        write_prom(prom_path, [{"host": d.host, "status": d.verdict.value, "findings": d.findings,
                                "duration_s": total, "timestamp": time.time()}])
    if as_json:
        from gpudoctor.report import to_json

        click.echo(to_json(d))
    else:
        from gpudoctor.report import Scope, render

        ctx = target.context
        scope = Scope(host=target.name if target.remote else None, inventory=None if snapshot_path else inventory,
                      units=tuple(ctx.units if snapshot_path else units),
                      models=tuple(ctx.model_paths if snapshot_path else models),
                      snapshot_of=d.host if snapshot_path else None)
        render(d, _styled(), verbose=show_all, scope=scope, triage=triage, quiet=settings().quiet)
    raise SystemExit(d.exit_code)


def _warm_imports(as_json: bool) -> None:
    """Import the checks and the renderer while the probes run: the probes wait on subprocesses, not the CPU. (The
    text report no longer imports rich: nothing of it to warm.)"""
    import threading

    def warm():
        import gpudoctor.checks  # noqa: F401
        import gpudoctor.diagnose  # noqa: F401
        import gpudoctor.report  # noqa: F401

    threading.Thread(target=warm, daemon=True).start()


def _check_fleet(inventory, all_hosts, groups, parallel, timeout, as_json, prom_path, host_timeout=None) -> int:
    """Fleet mode: every selected host concurrently; one record per host; the worst host's exit code."""
    from gpudoctor.commands import say_inventory
    from gpudoctor.fleet import check_fleet, default_check_fn, select_hosts
    from gpudoctor.inventory import load_inventory

    inv = load_inventory(inventory)
    say_inventory(inv)
    names = select_hosts(inv, all_hosts=all_hosts, groups=groups)
    if not names:
        raise InputError("the inventory selects no hosts", path=inv.path)
    from gpudoctor.progress import Waiting

    with Waiting("check --all", names) as waiting:
        result = check_fleet(inv, names, parallel=parallel, check_fn=default_check_fn(inv, timeout),
                             host_timeout=host_timeout, on_done=lambda rec: waiting.done(rec.host))
    if prom_path:
        from gpudoctor.integrations.promfile import write_prom

        write_prom(prom_path, result.prom_records())
    if as_json:
        import json

        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        from gpudoctor.report import fleet_table

        fleet_table(result, _console())
    return result.exit_code


def _explain(check_id: str, as_json: bool = False) -> int:
    from gpudoctor.checkreg import all_checks

    specs = {c.id: c for c in all_checks()}
    if check_id not in specs and check_id.endswith("]") and "[" in check_id:
        check_id = check_id.split("[", 1)[0]  # the key as the table prints it: ID[SUBJECT]
    if check_id not in specs:
        near = [i for i in specs if check_id.split(".")[0] in i]
        raise InputError(f"unknown check id {check_id!r}" + (f"; did you mean one of: {', '.join(near[:6])}" if near else
                                                            "; `gpudoctor checks` lists them"))
    c = specs[check_id]
    if as_json:
        import json

        click.echo(json.dumps({"schema": "gpudoctor.check-explain/1", "id": c.id, "layer": c.layer,
                               "summary": c.summary, "doc": c.doc, "depends_on": list(c.depends_on),
                               "remedy": c.remedy}, indent=2))
        return 0
    click.echo(f"{c.id}  (layer {c.layer})\n\n{c.summary}\n\n{c.doc}")
    if c.depends_on:
        click.echo(f"\nIts findings can be symptoms of: {', '.join(c.depends_on)} — each finding only of those its evidence "
                   f"can follow from (a missing tool or library is its own cause).")
    if c.remedy:
        click.echo(f"\nRemedy: gpudoctor fix --only {c.remedy}")
    return 0


@click.command("snapshot")
@common
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False),
              help="Where to write the snapshot JSON ('-' for stdout; the default when stdout is not a terminal).")
@click.option("--json", "as_json", is_flag=True, help="The snapshot is JSON (schema gpudoctor.snapshot/1) anyway.")
@click.option("--deep", is_flag=True, help="Also record the deep tier: each GPU measured against its physical limit and "
              "the NCCL all-reduce probe per TP group (occupies the GPUs).")
@click.option("--deep-python", metavar="PATH", help="Python with torch for --deep (default: the first with torch of a "
              "running SGLang/vLLM/transformers server's, the inventory's, python3 on PATH; docs/deep.md).")
@click.option("--force", "deep_force", is_flag=True,
              help="With --deep: also measure a GPU another process holds.")
@click.option("--unit", "units", multiple=True, metavar="UNIT",
              help="Also record this systemd unit's device policy (repeatable); replays with the snapshot.")
def snapshot(host_name, inventory, expect_gpus, models, sglang_url, timeout, output, deep, deep_python, deep_force=False,
             units=(), as_json=False):
    """Gather a host's facts (and the raw reads behind them) into one JSON file.

    Diagnose it anywhere later with `gpudoctor check --snapshot FILE` — for bug reports, CI and replay.
    Secrets never go in: only NCCL_*/CUDA_VISIBLE_* variables are read, with key-like names redacted.
    Without -o the snapshot goes to stdout when that is a pipe or file (gpudoctor snapshot > s.json).

    Exit codes: 0 written, 3 bad input or nothing could be gathered.
    """
    import json

    from gpudoctor import snapshot as snap
    from gpudoctor.files import safe

    if output is None:  # like `git show`: to a pipe or file by default; not a screenful of JSON on a terminal
        if sys.stdout.isatty():
            raise InputError("snapshot: give -o FILE (or -o - for this terminal), or pipe it: gpudoctor snapshot > s.json")
        output = "-"
    if output != "-":
        output_file(output, "snapshot file")
    with open_check_target(host_name, inventory, expect_gpus, models, sglang_url, timeout, deep=deep,
                           deep_python=deep_python, units=units, deep_force=deep_force) as target:
        target.connect()
        doc = snap.take(target.host, target.context)
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if output == "-":
        click.echo(text, nl=False)
    else:
        safe.write_file(output, text)  # 0600, never through a link (#40)
        click.echo(f"wrote {output} ({len(text) // 1024} KiB, {len(doc['transcript'])} recorded reads)", err=True)
    raise SystemExit(EXIT_OK)


@click.command("checks")
@click.option("--markdown", is_flag=True, help="Print docs/checks.md.")
@click.option("--json", "as_json", is_flag=True,
              help="Machine-readable: {schema, checks: [{id, layer, summary, depends_on, remedy}]}.")
def list_checks(markdown, as_json):
    """List every check id, its layer and one-line purpose.

    Exit codes: 0 listed.
    """
    from gpudoctor.checkreg import all_checks

    specs = all_checks()
    if as_json:
        import json

        click.echo(json.dumps({"schema": "gpudoctor.checks/1", "checks": [
            {"id": c.id, "layer": c.layer, "summary": c.summary, "depends_on": list(c.depends_on), "remedy": c.remedy}
            for c in specs]}, indent=2))
    elif markdown:
        click.echo("# Checks\n\nGenerated by `gpudoctor checks --markdown`. Ids are stable; `gpudoctor check --explain ID`"
                   " prints the details.\n")
        for layer in LAYERS:
            rows = [c for c in specs if c.layer == layer]
            if not rows:
                continue
            click.echo(f"\n## {layer}\n\n| id | purpose | remedy |\n|---|---|---|")
            for c in rows:
                click.echo(f"| `{c.id}` | {c.summary} | {('`' + c.remedy + '`') if c.remedy else ''} |")
    else:
        for c in specs:
            click.echo(f"{c.id:34s} {c.layer:9s} {c.summary}")
    raise SystemExit(EXIT_OK)
