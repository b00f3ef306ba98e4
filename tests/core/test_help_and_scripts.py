"""Every option teaches (#19: `checks --json` had no help text) and the bench scripts take bad input without a
traceback (`bench/fleet_scale.py --simulated 0` ended in IndexError)."""

import subprocess
import sys
from pathlib import Path

import click

from gpudoctor.cli import cli as root
from tests.console import commands

ROOT = Path(__file__).resolve().parents[2]




def test_every_option_of_every_command_has_help_text():
    missing = [f"gpudoctor {' '.join(path)} {'/'.join(p.opts)}" for path, cmd in commands(root)
               for p in cmd.params if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
               and "--help" not in p.opts]
    assert missing == []


def _bench(*args):
    return subprocess.run([sys.executable, str(ROOT / "bench" / "fleet_scale.py"), *args], capture_output=True,
                          text=True, timeout=120)


def test_fleet_scale_simulated_0_skips_that_part():
    r = _bench("--simulated", "0", "--skip-ssh")
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr
    assert "simulated: skipped (--simulated 0)" in r.stdout


def test_fleet_scale_bad_numbers_are_one_usage_line():
    for args in (["--simulated", "-1"], ["--hosts", "0"], ["--parallel", "x"]):
        r = _bench(*args, "--skip-ssh")
        assert r.returncode == 2 and "Traceback" not in r.stderr, args
        assert r.stderr.strip().splitlines()[-1].startswith("fleet_scale.py: error: argument "), args
