"""The gathers' own subprocess probes, started at CLI entry beside the cuInit probe (host/early.py).

#33: with NVML in process, the cuInit probe was no longer a live check's critical path on the H200: the process scan,
the kernel log reader, the sysfs probe and the tool probe started only once click, the CLI and the checks were imported and the
gather began, and ended after cuInit had answered. Started here, they run on other cores while this process imports.
Each argv is the one the gather itself builds (probe_argv of its module, for the context the command line gives);
LocalHost.run adopts a process only when the argv is identical, so a context this cannot know at entry (an inventory's
policy: another kernel log window, other serving ports) only leaves an unadopted probe, killed at exit, and the gather
runs its own."""

from __future__ import annotations

import sys


def _option(args: list[str], name: str) -> str | None:
    """The value of `--name V` / `--name=V` in args (the last one, as click takes it), else None."""
    val = None
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            val = args[i + 1]
        elif a.startswith(name + "="):
            val = a.split("=", 1)[1]
    return val


def argvs(args: list[str], python: list[str] | None = None) -> list[list[str]]:
    """The probes' command lines for a live local check with these arguments; [] when they cannot be known here (a
    --timeout click will refuse)."""
    import os

    from gpudoctor.gather import fabric, kernel_log, procs, tools
    from gpudoctor.gather.context import GatherContext

    python = python or [sys.executable]
    t = _option(args, "--timeout")
    try:
        timeout = 10.0 if t is None else float(t)
    except ValueError:
        return []
    ctx = GatherContext(name="", timeout=timeout, sglang_url=_option(args, "--sglang-url"))
    systemd = os.path.isdir("/run/systemd/system")  # the tool probe's one input (the gather stats it in its batch)
    return [procs.probe_argv(python, ctx), kernel_log.probe_argv(python, ctx), fabric.probe_argv(python, ctx),
            tools.probe_argv(systemd)]
