"""Probes started before the rest of gpudoctor is imported. A live local `check`/`gate` spends most of its wall time
waiting for cuInit, so the console script (gpudoctor/entry.py) starts its probes first; LocalHost.run() of the same
argv adopts the running process (its deadline counts from the start) and whatever nobody adopts is killed at exit;
LocalHost.nvml() adopts the NVML read started here.
Stdlib only, and nothing here imports the rest of gpudoctor: it runs before click is imported (#28); the gathers'
probe command lines come from the caller (gpudoctor/entry.py: gather/prestart.py, imported after the cuInit probe
started)."""

import sys

# Options after which `check`/`gate` does not look at this machine's GPUs (a remote host, a snapshot, a fleet, help).
REMOTE_OR_OFFLINE = {"--host", "--snapshot", "--all", "--group", "--explain", "--facts", "-h", "--help", "--inventory",
                     "-i"}
# The global options (gpudoctor/conventions.py) that may come before the command; those taking a value
GLOBAL_FLAGS, GLOBAL_VALUED = {"--verbose", "-q", "--quiet", "--json"}, {"--color", "-i", "--inventory"}

EARLY: dict = {}  # argv tuple -> (Popen, perf_counter at start); host/local.py adopts (or kills) them


def _is_verbose_flag(a: str) -> bool:
    """The group's own option before the command: -v, -vv, ..., --verbose."""
    return a == "--verbose" or (len(a) > 1 and a[0] == "-" and set(a[1:]) == {"v"})


def command_args(args) -> list:
    """args from the command name on: `gpudoctor -vv check` is a check too (#33: the H200's `-vv check` logs were
    of a check whose probes had not started early); so is `gpudoctor -q --color never check`."""
    args = list(args)
    while args:
        a = args[0]
        if _is_verbose_flag(a) or a in GLOBAL_FLAGS or a.split("=")[0] in GLOBAL_VALUED and "=" in a:
            args.pop(0)
        elif a in GLOBAL_VALUED:
            del args[:2]
        else:
            break
    return args


def is_live_check(args) -> bool:
    """`check` or `gate` of this machine (not a remote host, a snapshot, a fleet or help)."""
    whole, args = list(args), command_args(args)
    return bool(args) and args[0] in ("check", "gate") and not any(a.split("=")[0] in REMOTE_OR_OFFLINE for a in whole)


def spawn(argv, fork_program: str | None = None) -> None:
    """Start a probe now (its own session, no stdin); LocalHost.run() of the same argv adopts it. With
    `fork_program` (argv's `-c` program, stdlib only) and one thread here, it runs in a fork of this process instead
    of a new interpreter (host/forked.py): the same program and answer, without the interpreter's start."""
    import time

    if tuple(argv) in EARLY:
        return
    try:
        from gpudoctor.host.forked import Forked, can_fork

        if fork_program is not None and can_fork():
            proc = Forked(argv, fork_program)  # before subprocess is imported: nothing more before the fork
        else:
            import subprocess

            from gpudoctor.host.childpy import CWD

            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, cwd=CWD)  # as LocalHost.run would start it
    except OSError:
        return
    EARLY[tuple(argv)] = (proc, time.perf_counter())
    if len(EARLY) == 1:
        import atexit

        atexit.register(kill_unadopted)


def kill_unadopted() -> None:
    """Kill every early probe nobody adopted (the run ended before its gather: bad input, an error)."""
    import os
    import signal

    for proc, _ in list(EARLY.values()):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                proc.kill()
            except OSError:
                pass
        try:
            proc.wait(timeout=1.0)
        except Exception:  # noqa: BLE001 - a process stuck in the kernel: never wait on it forever
            pass
    EARLY.clear()


def start_probes(args, more=None) -> None:
    """For a live local check: the cuInit probe first (it dominates), then the gathers' other subprocess probes
    (`more(args)`: their argvs; #33: started at gather time they ended after cuInit), then NVML's reads in a thread of this
    process (host/nvml.py; #33: `nvidia-smi -q -x` beside cuInit was the critical path). nvidia-smi runs only where
    NVML does not answer (gather/driver.py)."""
    if not is_live_check(args):
        return
    from gpudoctor.cuda_probe import PROBE  # stdlib only, like this module
    from gpudoctor.host.childpy import python_argv

    # forked: no second interpreter to start
    spawn(python_argv([sys.executable], "-c", PROBE, site=False), fork_program=PROBE)
    from gpudoctor.host.nvml import start_early  # stdlib; pynvml is imported in its thread
    # `more`: the gathers' probes (gpudoctor/entry.py passes gather/prestart.py's; host/ does not import gather/).
    # After the cuInit probe, whose start their imports must not delay; before NVML's thread, which would hold the
    # GIL while they are spawned.
    for argv in more(command_args(args)) if more else []:
        spawn(argv)
    start_early()
