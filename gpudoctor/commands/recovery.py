"""`gpudoctor release HOST` (verify, then release) and `gpudoctor recovery show` (each host's ladder, read only)."""

from __future__ import annotations

import json
import socket
import time

import click

from gpudoctor.exitcodes import EXIT_OK, EXIT_WARN
from gpudoctor.options import seconds

_FILE_HELP = ("The ladder's file (default: $STATE_DIRECTORY/recovery.json, /var/lib/gpudoctor/recovery.json as root): "
              "the one the daemon and the gates keep.")


def _when(ts) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else "-"


@click.command("release")
@click.argument("host")
@click.option("--inventory", "-i", type=click.Path(dir_okay=False), envvar="GPUDOCTOR_INVENTORY",
              help="Inventory with the host and its policy verify: (default: ./inventory.yaml, then "
                   "~/.config/gpudoctor/inventory.yaml).")
@click.option("--recovery-file", type=click.Path(dir_okay=False), default=None, metavar="FILE", help=_FILE_HELP)
@click.option("--timeout", type=seconds(0.1, 600), default=10.0, show_default=True,
              help="Deadline in seconds for each command the connection runs (the verification has its own bound, "
                   "policy.verify.timeout_s).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result (schema gpudoctor.release/1).")
def release(host, inventory, recovery_file, timeout, as_json):
    """Return HOST to service after an inspection: run the verification first, release only if it passes.

    The supported way out of `needs-inspection` (a root cause that kept coming back: no unattended heals until a
    person looks). It also releases a host that is `verifying` once its verification passes. HOST is an inventory
    host, or `local` / this machine's name. The ladder then says `ready`: the next `gate --slurm` run resumes
    gpudoctor's own drain (never an admin's), `gate --npd` and `gate --recovery` pass, /metrics shows
    gpudoctor_ready 1. Refused while the host's last passive check failed.

    \b
    Examples:
      gpudoctor release gpu01                 verify this machine (named gpu01) and release it
      gpudoctor release ct200 -i inv.yaml     verify ct200 over SSH and release it
      gpudoctor recovery show                 where every host stands

    \b
    Exit codes: 0 released; 1 verification failed (or another process is verifying), the host stays where it was;
    3 bad input (unknown host, bad inventory).
    """
    from gpudoctor.commands import say_inventory
    from gpudoctor.host.local import read_boot_id
    from gpudoctor.recovery import advance, gates
    from gpudoctor.target import LOCAL_NAMES, live, open_target

    local = host in LOCAL_NAMES or host == socket.gethostname()
    with open_target(None if local else host, inventory, timeout=timeout) as target:
        say_inventory(target)
        store = gates.store_for(recovery_file)
        verify = gates._verifier(live(target, "release a host"))  # the door: only a live target is released
        adv = advance.release(store, target.name, verify, boot_id=read_boot_id() if local else None, driver=None)
    v = adv.verification
    released = adv.ready and v is not None and bool(v.passed)  # never on a verification that failed
    doc = {"schema": "gpudoctor.release/1", "host": adv.host, "released": released, "busy": adv.busy,
           "state": adv.ladder.state, "reason": adv.ladder.reason, "since": adv.ladder.since,
           "verification": v.to_json() if v is not None else None}
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    elif released:
        click.echo(f"released {adv.host}: verification passed; ready since {_when(adv.ladder.since)}")
    elif adv.busy:
        click.echo(f"not released {adv.host}: a verification is running in another process; try again", err=True)
    else:
        why = f"verification failed: {v.reason}" if v is not None and not v.passed else adv.ladder.reason
        click.echo(f"not released {adv.host} ({adv.ladder.state}): {why}", err=True)
    raise SystemExit(EXIT_OK if released else EXIT_WARN)


@click.group("recovery")
def recovery():
    """The recovery ladder: where each host stands on its way back to service (docs/recovery.md)."""


recovery.add_command(release)  # `gpudoctor recovery release HOST` is `gpudoctor release HOST` (docs/cli.md)


@recovery.command("show")
@click.option("--recovery-file", type=click.Path(dir_okay=False), default=None, metavar="FILE", help=_FILE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable (schema gpudoctor.recovery-show/1).")
def show(recovery_file, as_json):
    """Each host's ladder state, whether it is ready, since when, and why not (read only: nothing moves).

    A `ready` host whose verification was on another boot of this machine shows as `verifying`: it is not ready
    until it verifies again, whatever the file says.

    \b
    Exit codes: 0 every host ready; 1 a host is not ready; 3 bad input.
    """
    from gpudoctor.host.local import read_boot_id
    from gpudoctor.recovery import gates
    from gpudoctor.recovery.ladder import view

    store = gates.store_for(recovery_file)
    here, boot = socket.gethostname(), read_boot_id()
    rows = []
    for name, lad in sorted(store.load().items()):
        state, reason, ready = view(lad, boot if name == here else lad.boot_id)
        rows.append({"host": name, "state": state, "ready": ready, "since": lad.since, "reason": reason,
                     "verified_at": lad.verified_at, "last_verification": lad.last_verification})
    if as_json:
        click.echo(json.dumps({"schema": "gpudoctor.recovery-show/1", "file": str(store.path),
                               "set_aside": store.aside, "hosts": rows}, indent=2))
    else:
        if store.aside:
            click.echo(f"the ladder's file was unreadable and was moved to {store.aside}: every host starts again "
                       "as never verified", err=True)
        if not rows:
            click.echo(f"no host on the ladder yet ({store.path})")
        for r in rows:
            click.echo(f"{r['host']}  {r['state']}  since {_when(r['since'])}" + (f"  {r['reason']}" if r["reason"]
                                                                                 else ""))
    raise SystemExit(EXIT_OK if all(r["ready"] for r in rows) else EXIT_WARN)
