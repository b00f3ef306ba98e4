"""gpudoctor/conventions.py in process (#48 item 6: -i precedence and the help line listing the global options had
no test): a small group adopted the way cli.py adopts gpudoctor's, its settings printed by a command."""

from __future__ import annotations

import json
import os
import re

import click
import pytest
from click.testing import CliRunner

from gpudoctor import conventions as conv


def _cli():
    @click.group(cls=conv.DidYouMeanGroup)
    @conv.root_options
    def root():
        """A test group."""

    @root.command("show")
    @click.option("--json", "as_json", is_flag=True)
    def show(as_json):
        """Print the settings. And more text here."""
        s = conv.settings()
        click.echo(json.dumps({"verbose": s.verbose, "quiet": s.quiet, "json": s.json, "color": s.color,
                               "inventory": s.inventory, "as_json": as_json}))

    @root.command("plain")
    @conv.alias("--snapshot", "--facts", "path", hidden_aliases=["--facts"])
    def plain(path):
        """No JSON here"""
        click.echo(f"path={path}")

    @root.command("old")
    @click.option("--facts", "path")
    def old(path):
        """Declares the old spelling only."""
        click.echo(f"path={path}")

    return conv.adopt(root)


def run(*args, env=None):
    r = CliRunner().invoke(_cli(), list(args), env={"GPUDOCTOR_INVENTORY": None, **(env or {})},
                           catch_exceptions=False)
    return r


def shown(*args, env=None) -> dict:
    r = run(*args, env=env)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_inventory_from_the_command_line_beats_the_environment_wherever_it_is_given():
    env = {"GPUDOCTOR_INVENTORY": "env.yaml"}
    assert shown("show", env=env)["inventory"] == "env.yaml"
    assert shown("-i", "cli.yaml", "show", env=env)["inventory"] == "cli.yaml"
    assert shown("show", "-i", "cli.yaml", env=env)["inventory"] == "cli.yaml"
    assert shown("--inventory", "a.yaml", "show", "-i", "b.yaml")["inventory"] == "b.yaml"
    assert shown("show")["inventory"] is None


def test_verbose_counts_and_flags_fold_wherever_given():
    assert shown("-v", "show", "-vv")["verbose"] == 3
    s = shown("--json", "show")
    assert s["json"] is True and s["as_json"] is True and s["quiet"] is False
    assert shown("show", "-q")["quiet"] is True and shown("show")["json"] is False


def test_color_given_anywhere_and_its_environment(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert shown("--color", "always", "show")["color"] == "always"
    assert os.environ.get("FORCE_COLOR") == "1" and "NO_COLOR" not in os.environ
    assert shown("show", "--color", "never")["color"] == "never"
    assert os.environ.get("NO_COLOR") == "1" and "FORCE_COLOR" not in os.environ
    assert shown("--color", "never", "show")["color"] == "never"  # the subcommand's default does not undo it
    assert shown("show")["color"] == "auto"


def test_quiet_and_verbose_contradict():
    r = run("-q", "show", "-v")
    assert r.exit_code == 2 and "-q and -v contradict each other" in r.output


def test_the_help_lists_the_global_options_in_one_line():
    r = run("show", "--help")
    assert r.exit_code == 0
    assert re.search(r"(?<![A-Za-z])Global options, before or after the command: -v/-vv, -q, --json, --color WHEN, "
                     r"-i FILE \(docs/cli\.md\)\.(?![A-Za-z])", " ".join(r.output.split())), r.output
    assert "--inventory" not in r.output  # hidden on a command: the root's help shows them
    root = run("--help").output
    assert "-i, --inventory FILE" in root and "--color WHEN" in root and "[default: auto]" in root


def test_a_command_without_json_refuses_it():
    r = run("plain", "--json")
    assert r.exit_code == 2 and "--json: `plain` writes no JSON" in r.output
    assert run("plain", "--snapshot", "s").output == "path=s\n"


def test_old_spellings_work_and_are_hidden():
    assert run("plain", "--facts", "f").output == "path=f\n"
    assert "--facts" not in run("plain", "--help").output and "--snapshot" in run("plain", "--help").output
    assert run("old", "--snapshot", "n").output == "path=n\n"  # the new name added where the old is declared
    assert run("old", "--facts", "o").output == "path=o\n"
    h = run("old", "--help").output
    assert "--snapshot" in h and "--facts" not in h


def test_a_mistyped_command_names_the_nearest():
    r = run("shwo")
    assert r.exit_code == 2 and "Did you mean 'show'?" in r.output
    assert "Did you mean" not in run("zzzzzz").output


def test_summaries_are_whole_sentences():
    assert conv.summary("Print the settings. And more text here.") == "Print the settings."
    assert conv.summary("No JSON here") == "No JSON here."
    assert conv.summary("Is it?\n\nMore.") == "Is it?"
    assert conv.summary("A\nwrapped   line.") == "A wrapped line."
    h = run("--help").output
    assert "Print the settings." in h and "No JSON here." in h and "And more" not in h


def test_settings_outside_a_command_are_the_defaults_and_a_root_object_is_them():
    assert conv.settings() == conv.Settings()
    r = CliRunner().invoke(_cli(), ["show"], obj=conv.Settings(json=True, inventory="o.yaml"), catch_exceptions=False)
    doc = json.loads(r.output)
    assert doc["json"] is True and doc["inventory"] == "o.yaml"


def test_the_verbosity_reaches_the_logger():
    from gpudoctor import log

    shown("-vv", "show")
    assert log._settings["verbosity"] == 2
    shown("-q", "show")
    assert log._settings["verbosity"] == -1
    shown("show")
    assert log._settings["verbosity"] == 0


def test_the_old_findings_spelling_gains_the_new_name():
    @click.command("c")
    @click.option("--verbose-findings", "show_all", is_flag=True)
    def c(show_all):
        """C."""
        click.echo(f"all={show_all}")

    cmd = conv.adopt(c)
    r = CliRunner().invoke(cmd, ["--all-findings"], catch_exceptions=False)
    assert r.output == "all=True\n"
    assert "--all-findings" in CliRunner().invoke(cmd, ["--help"]).output


def test_exit_codes_are_nagios_and_a_shells_sigint():
    assert (conv.EXIT_OK, conv.EXIT_WARN, conv.EXIT_FAIL, conv.EXIT_UNKNOWN, conv.EXIT_INTERRUPTED) == (0, 1, 2, 3, 130)


def test_the_root_help_explains_each_global_option():
    h = " ".join(run("--help").output.split())
    for text in ("More log detail on stderr (-v info, -vv debug).",
                 "Say less: only what is not ok and the verdict; no notes on stderr.",
                 "Machine-readable output with a `schema` field (docs/json-schema.md).",
                 "Colour: auto (a terminal, unless NO_COLOR), always, never.",
                 "Inventory file (default: $GPUDOCTOR_INVENTORY, ./inventory.yaml, ~/.config/gpudoctor/inventory.yaml)."):
        assert re.search(r"(?<![A-Za-z])" + re.escape(text) + r"(?![A-Za-z])", h), text
    r = run("-q", "show", "-v")
    assert "Error: -q and -v contradict each other: give one\n" in r.output


def test_color_auto_leaves_the_environment_alone(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    shown("show")
    assert "NO_COLOR" not in os.environ and "FORCE_COLOR" not in os.environ


def test_an_inventory_that_is_a_directory_is_refused(tmp_path):
    r = run("-i", str(tmp_path), "show")
    assert r.exit_code == 2 and "is a directory" in r.output


def test_adopt_is_idempotent_and_keeps_what_a_command_says_itself():
    @click.group()
    def grp():
        """A plain group."""

    @grp.command("leaf", short_help="Short.", epilog="Its own epilog.")
    @click.option("--json", "as_json", is_flag=True, help="Write the leaf as JSON.")
    def leaf(as_json):
        """Long text. More."""
        click.echo(f"json={as_json}")

    @grp.command("raw", add_help_option=False)
    def raw():
        """Raw."""

    @grp.command("nojson")
    def nojson():
        """No json."""

    conv.adopt(grp)
    conv.adopt(grp)
    assert leaf.epilog.count("Global options") == 1 and leaf.epilog.startswith("Its own epilog.\n\nGlobal options")
    assert raw.epilog is None and isinstance(grp, conv.DidYouMeanGroup)
    r = CliRunner().invoke(grp, ["--help"])
    assert "Short." in r.output and "Long text" not in r.output
    h = CliRunner().invoke(grp, ["leaf", "--help"]).output
    assert "Write the leaf as JSON." in h and "Its own epilog." in h
    assert CliRunner().invoke(grp, ["leaf", "--json"]).output == "json=True\n"
    r = CliRunner().invoke(grp, ["nojson", "--json"])
    assert r.exit_code == 2 and "writes no JSON" in r.output


def test_a_nested_plain_group_is_adopted_too():
    @click.group(cls=conv.DidYouMeanGroup)
    def top():
        """Top."""

    @top.group("sub")
    def sub():
        """Sub."""

    @sub.command("leaf")
    def leaf():
        """Leaf."""

    conv.adopt(top)
    assert isinstance(sub, conv.DidYouMeanGroup)
    assert "Global options" in (leaf.epilog or "")
    assert "Did you mean 'leaf'?" in CliRunner().invoke(top, ["sub", "laef"]).output


def test_summary_keeps_other_endings_and_unwraps_click_markers():
    assert conv.summary("Go!") == "Go!"
    assert conv.summary("\bA\bb c.") == "A b c."
