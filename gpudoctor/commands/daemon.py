"""`gpudoctor daemon`: watch hosts, heal them within budgets, export metrics; systemd-native."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import click

from gpudoctor.errors import EXIT_OK, ConfigError
from gpudoctor.options import seconds


def _default_state() -> str:
    from gpudoctor.recovery.store import state_dir

    return str(state_dir() / "daemon.json")


def _reset_breaker(state_path: str) -> int:
    """Close the breakers: signal the running daemon (SIGUSR2), or edit the state file when none runs."""
    from gpudoctor.daemon.state import StateStore, read_state_file

    raw = read_state_file(state_path)
    if raw is None:
        click.echo(f"no daemon state at {state_path}: nothing to reset")
        return EXIT_OK
    pid = raw.get("pid")
    from gpudoctor.recovery.gates import pid_is_daemon

    if pid and pid_is_daemon(pid):
        os.kill(int(pid), signal.SIGUSR2)
        click.echo(f"asked the running daemon (pid {pid}) to close its circuit breakers")
        return EXIT_OK
    store = StateStore(state_path)
    state = store.load()
    for h in state.hosts.values():
        h.breaker.reset()
    store.save(state)
    click.echo(f"closed the circuit breakers in {state_path}")
    return EXIT_OK


PRIVATE_TMP = ("/tmp", "/var/tmp")  # what the units' PrivateTmp=yes replaces with an empty directory of their own


def install_problem(paths=None) -> str | None:
    """Why the systemd units (systemd/*.service: PrivateTmp=yes) cannot start this install, or None: a gpudoctor,
    or the python it runs, under /tmp or /var/tmp is hidden from them (systemd says only status=203/EXEC). A path is
    judged as written and resolved: a venv's bin/python under /tmp is hidden even where it links to /usr/bin."""
    import gpudoctor

    script = shutil.which("gpudoctor")
    paths = paths if paths is not None else [p for p in (sys.executable, os.path.dirname(gpudoctor.__file__), script)
                                             if p]
    for p in paths:
        for seen in (os.path.abspath(p), os.path.realpath(p)):
            for tmp in PRIVATE_TMP:
                if seen == tmp or seen.startswith(tmp + "/"):
                    return (f"{p} lies under {tmp}, which the systemd units hide (PrivateTmp=yes): they cannot start "
                            "it (status=203/EXEC); install gpudoctor elsewhere (./install.sh as root: /opt/gpudoctor)")
    return None


def _check_install() -> int:
    why = install_problem()
    if why:
        raise ConfigError(why)
    click.echo("the systemd units can start this gpudoctor (it does not lie under /tmp or /var/tmp)")
    return EXIT_OK


def unread_inventory() -> str | None:
    """The inventory every other command would find here (./inventory.yaml, ~/.config/gpudoctor/inventory.yaml)
    and the daemon, given none (-i or $GPUDOCTOR_INVENTORY, which -i defaults to), does not read: a healing policy is
    never picked up from the working directory or a home (systemd starts it in /). Only whether one exists: nothing
    of it is opened."""
    from gpudoctor.inventory import default_locations

    found = next((p for p in default_locations() if p.is_file()), None)
    return None if found is None else str(found) if found.is_absolute() else f"./{found}"


@click.command("daemon")
@click.option("--interval", type=seconds(1.0, 7 * 86400), default=120.0, show_default=True, metavar="SECONDS",
              help="Seconds between checks.")
@click.option("--metrics-addr", default="127.0.0.1:9835", show_default=True, metavar="HOST:PORT",
              help="Where to serve /metrics and /healthz; 'off' to disable. Port 0 picks a free port.")
@click.option("--once", is_flag=True, help="Run one check (and heal) cycle, then exit with the verdict's code.")
@click.option("--state", "state_path", default=None, metavar="FILE",
              help="State file (budgets, breaker) kept across restarts. Default: $STATE_DIRECTORY/daemon.json, "
                   "/var/lib/gpudoctor/daemon.json as root.")
@click.option("--inventory", "-i", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Inventory with hosts and the healing policy (policy.auto_apply, budgets). Reloaded on SIGHUP. "
                   "Only one named here (or $GPUDOCTOR_INVENTORY) is read, never ./inventory.yaml.")
@click.option("--host", "hosts", multiple=True, metavar="NAME", help="Inventory host(s) to watch (default: this machine).")
@click.option("--model", "models", multiple=True, metavar="PATH",
              help="Also check this model directory on every host each cycle (e.g. a tmpfs model that the model.stage "
                   "remedy restages when allowed).")
@click.option("--heal", multiple=True, metavar="REMEDY",
              help="Also allow this remedy id (fnmatch pattern) to be applied unattended.")
@click.option("--observe", is_flag=True, help="Never heal, whatever the policy says: only check and report.")
@click.option("--no-xid", is_flag=True, help="Do not watch NVML for XID errors.")
@click.option("--reset-breaker", is_flag=True, help="Close the circuit breakers (of the running daemon) and exit.")
@click.option("--check-install", is_flag=True,
              help="Say whether the systemd units can start this install (not under /tmp: PrivateTmp=yes) and exit.")
@click.option("--timeout", type=seconds(1.0, 3600), default=30.0, show_default=True, metavar="SECONDS",
              help="Per-host check budget.")
@click.option("--clock-file", hidden=True, default=None, help="Tests: read the clock from this file.")
@click.option("--engine", "engine_spec", hidden=True, default="gpudoctor.daemon.engine:pipeline_engine",
              help="Tests: module:factory of the engine.")
@click.option("--stall", "stall_s", hidden=True, type=seconds(1.0, 7 * 86400), default=900.0,
              help="Seconds one step may run before the watchdog pings stop.")
def daemon(interval, metrics_addr, once, state_path, inventory, hosts, models, heal, observe, no_xid, reset_breaker,
           timeout, clock_file, engine_spec, stall_s, check_install):
    """Watch GPU hosts, heal them within budgets, and export their health.

    At start and every --interval the daemon checks each host. For a failing host it applies only the remedies
    the policy allows (inventory `policy.auto_apply` minus `never_apply`, or --heal), each within a budget: at most N attempts per
    hour with exponential backoff after failures, container reboots at most once per hour, and a circuit breaker
    that stops all healing of a host after repeated failures until a cool-down passes or it is reset.
    A remedy only counts as a success once the next check shows its finding cleared.

    Each host also climbs the recovery ladder (docs/recovery.md): failing -> healing -> verifying -> ready, or
    needs-inspection when the same root cause keeps coming back (then no unattended heals). It is ready only after
    its checks pass for the policy's clean window and the active verification (policy verify:) passes; the ladder
    lives in recovery.json beside the state file, where the gates and `gpudoctor release` read it.

    \b
    Examples:
      gpudoctor daemon                                  watch this machine, report only
      gpudoctor daemon -i inventory.yaml --host ct200   watch ct200 over SSH, heal per its policy
      gpudoctor daemon --once --heal 'devices.*'        one cycle, e.g. from a timer
      gpudoctor daemon --reset-breaker                  let a stopped-healing daemon try again
      gpudoctor daemon --check-install                  can the systemd units start this install?
      curl -s 127.0.0.1:9835/metrics | grep gpudoctor_check_status

    \b
    Signals: SIGHUP reloads the inventory and policy, SIGTERM stops cleanly (Ctrl-C: exit 130), SIGUSR1 checks now,
    SIGUSR2 closes the circuit breakers. Under systemd (Type=notify) it sends READY=1, STATUS= and WATCHDOG=1.

    \b
    Exit codes: 0 clean stop on SIGTERM (with --once: host ok), 1 warn, 2 fail, 3 unknown or bad input, 130 Ctrl-C.
    """
    from gpudoctor.daemon.clock import make_clock
    from gpudoctor.daemon.engine import EngineConfig, load_factory
    from gpudoctor.daemon.loop import Daemon, DaemonConfig
    from gpudoctor.daemon.metrics import DaemonMetrics, MetricsServer, parse_addr
    from gpudoctor.daemon.sdnotify import Notifier, take_protocol_env
    from gpudoctor.daemon.state import StateStore

    if check_install:
        raise SystemExit(_check_install())
    state_path = state_path or _default_state()
    if reset_breaker:
        raise SystemExit(_reset_breaker(state_path))
    if inventory and not Path(inventory).is_file():
        raise ConfigError("inventory file not found", path=inventory)
    from gpudoctor.conventions import settings

    unread = None if inventory or settings().quiet else unread_inventory()

    def say_unread() -> None:  # every other command would read it: say once why the daemon does not (once it runs:
        if unread:             # bad input stays one line)
            click.echo(f"gpudoctor daemon: not reading {unread}: the daemon heals only by the policy of an "
                       "inventory named with -i (-i FILE to use it); watching this machine", err=True)
    serve = metrics_addr.lower() != "off" and not once
    if serve:
        parse_addr(metrics_addr)  # bad input fails before anything starts
    cfg = DaemonConfig(interval=interval, heal=tuple(heal), observe_only=observe, once=once, stall_s=stall_s,
                       engine=EngineConfig(inventory=inventory, hosts=tuple(hosts), timeout=timeout,
                                           state_dir=str(Path(state_path).parent), models=tuple(models)))
    metrics = DaemonMetrics() if serve else None
    xid_factory = None
    if not no_xid and not once:
        from gpudoctor.daemon.xid import XidWatcher as xid_factory

    notifier = Notifier(take_protocol_env())  # from here on, children inherit no NOTIFY_SOCKET (sdnotify.py)
    from gpudoctor.recovery.store import FILE, RecoveryStore

    d = Daemon(cfg, engine_factory=load_factory(engine_spec), clock=make_clock(clock_file),
               store=StateStore(state_path), notifier=notifier, metrics=metrics, xid_watcher_factory=xid_factory,
               recovery_store=RecoveryStore(Path(state_path).parent / FILE))
    d.load()
    if once:
        say_unread()
        code = d.run_once()
        from gpudoctor.report import daemon_cycle, writer

        daemon_cycle(writer(), d.found)
        raise SystemExit(code)
    server = MetricsServer(metrics_addr, metrics, d.health) if serve else None
    d.install_signals()
    if server is not None:
        server.start()
    d.prepare(server.address if server else None)
    say_unread()
    if not settings().quiet:  # in the foreground it said nothing, not even where /metrics listens (#41)
        who = ", ".join(hosts) if hosts else "the inventory's hosts" if inventory else "this machine"
        where = f"/metrics on http://{server.address}/metrics" if server else "no /metrics"
        click.echo(f"gpudoctor daemon: watching {who} every {interval:g} s; {where}; state {state_path}; "
                   "SIGTERM or Ctrl-C stops it", err=True)
    d.log.info("daemon.started", metrics=server.address if server else None, interval=interval,
               state=state_path)
    try:
        code = d.run_forever()
    finally:
        if server is not None:
            server.stop()
    raise SystemExit(code)
