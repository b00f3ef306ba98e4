"""Paper cuts of the console script (#23): a bare group prints its formatted help (exit 0, like --help), and a
reader that closes the pipe ends the run quietly (exit 141, nothing on stderr). Through the installed script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click
import pytest

from gpudoctor.cli import EXIT_PIPE
from gpudoctor.cli import cli as root
from tests.console import commands, console_script, gpudoctor


GROUPS = [(), *(path for path, cmd in commands(root) if isinstance(cmd, click.Group))]


def test_the_tree_has_groups_to_walk():
    assert () in GROUPS and ("lxc",) in GROUPS and ("bench",) in GROUPS and ("inventory",) in GROUPS
    assert len(GROUPS) >= 6


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(("gpudoctor",) + p))
def test_a_bare_group_prints_its_formatted_help_exit_0(path):
    bare = gpudoctor(*path)
    helped = gpudoctor(*path, "--help")
    assert bare.returncode == 0, bare.stderr
    assert bare.stderr == "" and "Error" not in bare.stdout
    assert bare.stdout == helped.stdout  # the same help, formatted: usage line, blank line, sections
    lines = bare.stdout.splitlines()
    assert lines[0].startswith(f"Usage: {' '.join(('gpudoctor',) + path)} [OPTIONS] COMMAND") and lines[1] == ""
    assert "Commands:" in lines


def test_an_unknown_subcommand_is_still_bad_input():
    r = gpudoctor("lxc", "nosuch")
    assert r.returncode == 3 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "No such command 'nosuch'" in r.stderr


def _into_closed_pipe(*args, stderr_too=False) -> tuple[int, str]:
    """Run the script with stdout a pipe whose reader is already gone (`| head` that exited): (exit code, stderr)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([console_script(), *args], stdout=w, stderr=w if stderr_too else subprocess.PIPE,
                           timeout=60)
    finally:
        os.close(w)
    return p.returncode, (p.stderr or b"").decode()


EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "h200-uvm-blocked.json")


# `check` and `check --snapshot` render with rich (term.console), which writes beneath cli.main's stream wrapper: the
# closed pipe must still reach it (#34: they exited 1, Nagios WARNING, for failing and healthy hosts alike)
@pytest.mark.parametrize("args", [["checks"], ["checks", "--json"], ["--help"], ["lxc"], ["check", "--json"],
                                  ["check"], ["check", "--snapshot", EXAMPLE], ["check", "--snapshot", EXAMPLE, "-a"]],
                         ids=lambda a: " ".join(x if x != EXAMPLE else "EXAMPLE" for x in a))
def test_a_closed_pipe_ends_quietly(args):
    code, err = _into_closed_pipe(*args)
    assert err == "", err
    assert code == EXIT_PIPE == 141


def test_a_closed_pipe_for_both_streams_ends_quietly():
    code, err = _into_closed_pipe("check", "--snapshot", "/nonexistent.json", stderr_too=True)  # an error line
    assert code == EXIT_PIPE and err == ""


def test_head_in_a_shell_pipeline():
    for cmd in ("checks | head -1", "check --json | head -c 10", "checks --markdown | head -3", "check | head -1",
                f"check --snapshot {EXAMPLE} | head -1"):
        p = subprocess.run(f"'{console_script()}' {cmd}; echo \"rc=${{PIPESTATUS[0]}}\" >&2", shell=True,
                           executable="/bin/bash", capture_output=True, text=True, timeout=60)
        rc = int(p.stderr.strip().rsplit("rc=", 1)[1])
        # the whole output may fit the pipe before head exits (then the command's own code), else 141; never noise
        assert p.stderr.strip().startswith("rc=") and "Error" not in p.stderr, (cmd, p.stderr)
        assert rc in (0, 2, 3, EXIT_PIPE), (cmd, rc)
        assert p.stdout, cmd
