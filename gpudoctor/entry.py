"""The console script's entry point. A live local `check`/`gate` spends most of its wall time waiting for cuInit, so
its probes start here, before click or any other part of gpudoctor is imported (#28: the probe used to start only
after the CLI's imports); everything else (imports, the other gathers) then overlaps with cuInit."""

import sys

from gpudoctor.host import early


def _gather_argvs(args: list) -> list:
    from gpudoctor.gather.prestart import argvs  # imported only once the cuInit probe has started

    return argvs(args)


def start_probes(args: list) -> None:
    """The cuInit probe, the gathers' own subprocess probes (gather/prestart.py) and NVML's read (host/early.py)."""
    early.start_probes(args, more=_gather_argvs)


def main(argv=None) -> None:
    start_probes(list(sys.argv[1:] if argv is None else argv))
    from gpudoctor.cli import main as cli_main

    cli_main(argv)
