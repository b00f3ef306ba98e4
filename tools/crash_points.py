#!/usr/bin/env python3
"""Print the crash-point harness's counts (issue #40, item 7): every remedy of the registry and every state writer,
stopped after each mutating step; writers, crash points, failures. Run as root from the checkout:

    .venv/bin/python tools/crash_points.py [NAME ...]    (exit 0 when there are no failures, else 1)
"""

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the harness and its scenarios live in tests/crash; gpudoctor is the installed one


def main(argv: list[str]) -> int:
    from tests.crash.harness import crash_all
    from tests.crash.writers import all_writers

    writers = [w for w in all_writers() if not argv or w.name in argv]
    total_points = total_fail = total_power = total_breaks = 0
    with tempfile.TemporaryDirectory(prefix="gpudoctor-crash-") as work:
        for w in writers:
            rep = crash_all(w, Path(work))
            total_points += rep.crash_points
            total_fail += len(rep.failures)
            total_power += rep.power_states
            total_breaks += rep.invariant_breaks
            print(f"{w.kind:6} {rep.line()}", flush=True)
            for f in rep.failures[:10]:
                print(f"       FAIL {f}", flush=True)
    print(f"crash points: {len(writers)} writers, {total_points} crash points, {total_power} power-loss states, "
          f"{total_fail} failures ({total_breaks} invariant breaks)")
    return 1 if total_fail else 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("crash_points.py needs root (device nodes, chown)", file=sys.stderr)
        sys.exit(3)
    sys.exit(main(sys.argv[1:]))
