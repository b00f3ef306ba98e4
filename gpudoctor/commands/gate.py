"""`gpudoctor gate`: exit 0 only when the host is ready; print only what blocks."""

from __future__ import annotations

import sys
import click

from gpudoctor.options import seconds

from gpudoctor.commands.check import common, open_check_target
from gpudoctor.errors import GpudoctorError, HostError


@click.command("gate")
@common
@click.option("--profile", default=None, metavar="NAME",
              help="What is required: default (no failures), serve, benchmark, or a profile from the inventory.")
@click.option("--snapshot", "snapshot_path", type=click.Path(dir_okay=False), help="Gate a saved snapshot instead.")
@click.option("--slurm", is_flag=True, help="Slurm prolog/HealthCheckProgram: drain the node on failure, resume it "
                                           "on success only if gpudoctor drained it; a node DOWN, FAIL, in "
                                           "maintenance, rebooting or drained by someone else is left as is.")
@click.option("--node", metavar="NAME", help="Slurm node name (default: $SLURMD_NODENAME, else `hostname -s`).")
@click.option("--npd", is_flag=True, help="node-problem-detector plugin: one line, exit 0 ok / 1 problem / 2 unknown.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result (schema gpudoctor.gate/1).")
@click.option("--deep", is_flag=True, help="Also run the deep tier (check --deep), for a profile with deep_floors: true.")
@click.option("--recovery", "use_ladder", is_flag=True,
              help="Pass only when the recovery ladder says ready: verified since the host's last failure, reboot or "
                   "driver change (docs/recovery.md). Use it where the gate returns a host to service (ExecStartPre=); "
                   "--slurm and --npd always do.")
@click.option("--recovery-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="The ladder's file (default: $STATE_DIRECTORY/recovery.json, /var/lib/gpudoctor/recovery.json "
                   "as root): the one the daemon keeps.")
@click.option("--recovery-wait", type=seconds(0, 3600), default=0.0, show_default=True, metavar="SECONDS",
              help="Where the daemon moves the ladder: wait up to this long while it has not yet judged this boot "
                   "or its verification is running (e.g. an ExecStartPre= at boot).")
def gate(host_name, inventory, expect_gpus, models, sglang_url, timeout, profile, snapshot_path, slurm, node, npd,
         as_json, deep=False, use_ladder=False, recovery_file=None, recovery_wait=0.0):
    """Pre-flight gate: exit 0 only when every required check passes; print only what blocks.

    Profiles choose what is required. `default` blocks on any failure; `serve` also requires the driver, the
    device nodes and CUDA to be ok; `benchmark` adds the model staged (workload.model.*), no more than 1024 MiB of
    GPU memory held by other processes (workload.gpu.foreign_memory) and the serving port free
    (workload.port.serving). An inventory's
    `profiles:` can define more (a list of check-id patterns, or {require, ignore, fail_free}).

    \b
    Examples:
      gpudoctor gate --host ct200 --profile benchmark && run-campaign
      ExecStartPre=/usr/local/bin/gpudoctor gate --profile serve           (systemd, before SGLang)
      HealthCheckProgram=/usr/local/sbin/gpudoctor-slurm-check             (a wrapper: gpudoctor gate --slurm)
      gpudoctor gate --npd                                                 (node-problem-detector custom plugin)

    \b
    With --recovery, --slurm and --npd the host must also be `ready` on the recovery ladder: a host that failed,
    rebooted or changed driver since it was last verified is blocked (BLOCK recovery.ladder: the reason) until its
    checks pass, a clean window passes and the active verification (policy verify:) passes. Where no gpudoctor
    daemon runs here, the gate moves the ladder itself and runs the verification when it is due.

    \b
    With --snapshot FILE nothing acts: a replay is another machine's (or moment's) facts. --slurm says what it would
    do to the node ("would drain NODE: reason") and changes nothing; --recovery and --slurm neither read nor move the
    ladder, whose verdict is then unknown (not judged); --npd says "replay, not this node" with exit 2 (unknown).

    \b
    Exit codes: 0 ready; 2 blocked (a failure, or a required check missing or not ok, or not ready on the ladder);
    3 could not decide (host unreachable, only unknowns, bad input).
    With --npd: 0 ok, 1 problem, 2 unknown, and exactly one line of output.
    """
    if npd and as_json:  # NPD reads exactly one line of text: JSON is not its format
        raise click.UsageError("--npd and --json do not combine (NPD reads one line of text)")
    if npd:
        raise SystemExit(_gate_npd((host_name, inventory, expect_gpus, models, sglang_url, timeout, profile,
                                    snapshot_path), recovery_file))
    ladder = use_ladder or slurm
    result, verdict = _evaluate(host_name, inventory, expect_gpus, models, sglang_url, timeout, profile,
                                snapshot_path, deep, ladder=ladder, recovery_file=recovery_file,
                                recovery_wait=recovery_wait)
    action = None
    if slurm:
        from gpudoctor.integrations import slurm as slurm_mode
        from gpudoctor.target import local_host

        # a replay's verdict acts on no node: say what would be done (slurm.apply refuses it by the same rule)
        if result.replayed:
            own = result.error is None and all(b.key == "recovery.ladder" for b in result.blockers)
            action = slurm_mode.dry(result, node, passed=own)  # the snapshot's own checks, not its unknown ladder
        else:
            action = slurm_mode.apply(result, local_host(), node=node)
    if as_json:
        import json

        doc = result.to_json()
        if verdict is not None:
            doc["recovery"] = verdict.to_json()
        if action is not None:
            doc["slurm"] = action.to_json()
        click.echo(json.dumps(doc, indent=2))
    else:
        from gpudoctor.report import emit, gate_lines, writer

        out, err_out = writer(), writer(stderr=True)
        for line, err in gate_lines(result, action, verdict):
            emit(err_out if err else out, line)
    raise SystemExit(result.exit_code)


def _evaluate(host_name, inventory, expect_gpus, models, sglang_url, timeout, profile, snapshot_path, deep=False,
              quiet=False, ladder=False, recovery_file=None, recovery_wait=0.0):
    """The gate's verdict on the target (gpudoctor.gate.gate_target) and, with `ladder`, the recovery ladder's
    (gpudoctor.recovery.gates) folded into it."""
    from gpudoctor.gate import gate_target

    with open_check_target(host_name, inventory, expect_gpus, models, sglang_url, timeout, snapshot_path,
                           deep=deep, quiet=quiet) as target:
        result = gate_target(target, profile)
        if not ladder:
            return result, None
        from gpudoctor.recovery import gates

        verdict = gates.judge(target, result, gates.store_for(recovery_file), wait_s=recovery_wait)
        return gates.apply(result, verdict), verdict


def _gate_npd(args, recovery_file=None) -> int:
    """NPD's contract: exactly one line on stdout and exit 0/1/2, whatever happens."""
    from gpudoctor.integrations import npd
    try:
        result = _evaluate(*args, quiet=True, ladder=True, recovery_file=recovery_file)[0]
        code, line = npd.verdict(result)
        if result.replayed:  # another machine's (or moment's) facts: never this node's condition
            code, line = npd.NPD_UNKNOWN, npd.fit(f"replay, not this node: {line}")
    except GpudoctorError as exc:
        code, line = npd.error_verdict(exc)
    except Exception as exc:  # noqa: BLE001 - NPD must get one line, never a traceback
        code, line = npd.error_verdict(f"internal error: {type(exc).__name__}: {exc}")
    click.echo(line)
    sys.stdout.flush()
    return code
