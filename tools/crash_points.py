#!/usr/bin/env python3
"""Print the crash harness's counts (issues #40 item 7, #48): every remedy of the registry and every state writer,
stopped before each mutating step, and every state a power cut can leave (tests/crash/power.py); writers, crash
points, power-loss states, failures, invariant breaks. Run as root with the INSTALLED gpudoctor's python:

    "$(./install.sh --where)/bin/python" tools/crash_points.py [NAME ...]   (exit 0 when nothing failed, else 1)

gpudoctor is the installed package (never this checkout's source tree, whose layout is not the installed one); only
the harness and its scenarios (the `tests` package) are loaded from the checkout, without putting it on sys.path.
"""

import importlib.abc
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class _TestsFromCheckout(importlib.abc.MetaPathFinder):
    """Finds the top-level `tests` package in this checkout (its submodules follow from its __path__)."""

    def find_spec(self, name, path=None, target=None):
        if name != "tests":
            return None
        return importlib.util.spec_from_file_location("tests", REPO / "tests" / "__init__.py",
                                                      submodule_search_locations=[str(REPO / "tests")])


def _installed_gpudoctor() -> str:
    """Import gpudoctor from sys.path with the checkout off it; refuse a checkout's source tree."""
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (REPO, REPO / "tools")]
    try:
        import gpudoctor
        import gpudoctor.checks  # noqa: F401
        import gpudoctor.remedies  # noqa: F401
    except ImportError as e:
        print(f"crash_points.py: gpudoctor is not installed for {sys.executable} ({e}); run ./install.sh "
              f"--extras test and this tool with its python", file=sys.stderr)
        sys.exit(3)
    return str(Path(gpudoctor.__file__).resolve().parent)


def main(argv: list[str]) -> int:
    pkg = _installed_gpudoctor()
    sys.meta_path.insert(0, _TestsFromCheckout())
    from tests.crash.harness import crash_all
    from tests.crash.writers import all_writers

    print(f"gpudoctor: {pkg}", flush=True)
    writers = [w for w in all_writers() if not argv or w.name in argv]
    unknown = sorted(set(argv) - {w.name for w in writers})
    if unknown:
        print(f"crash_points.py: no writer named {', '.join(unknown)}", file=sys.stderr)
        return 3
    points = fail = states = breaks = 0
    with tempfile.TemporaryDirectory(prefix="gpudoctor-crash-") as work:
        for w in writers:
            rep = crash_all(w, Path(work))
            points += rep.crash_points
            fail += len(rep.failures)
            states += rep.power_states
            breaks += rep.invariant_breaks
            print(f"{w.kind:6} {rep.line()}", flush=True)
            for f in rep.failures[:10]:
                print(f"       FAIL {f}", flush=True)
    print(f"crash points: {len(writers)} writers, {points} crash points, {states} power-loss states, "
          f"{fail} failures ({breaks} invariant breaks)")
    return 1 if fail else 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("crash_points.py needs root (device nodes, chown)", file=sys.stderr)
        sys.exit(3)
    sys.exit(main(sys.argv[1:]))
