"""docs/cli.md's conventions (#41), through the installed console script and against the click tree: global options
before or after the command, hidden old spellings, did-you-mean, exit codes, `--json` with a schema on every command
that has it, Ctrl-C, completion, the manual, help that is whole. docs/cli.md's tables are parsed and checked against
the tree, so the page cannot drift from the code."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from gpudoctor import conventions
from gpudoctor.cli import cli as root
from tests.console import commands, console_script, gpudoctor

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "cli.md").read_text()
EXAMPLE = str(REPO / "examples" / "h200-uvm-blocked.json")
LOGS = REPO / "tests" / "fixtures" / "serverlogs"
LEAVES = {" ".join(p): c for p, c in commands(root) if not isinstance(c, click.Group)}
GROUPS = [p for p, c in commands(root) if isinstance(c, click.Group)]


def table(heading: str) -> list[list[str]]:
    """The rows of the first table under `## heading` in docs/cli.md, cells stripped (header and rule dropped)."""
    section = DOC.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def command_of(cell: str) -> str:
    return re.fullmatch(r"`([a-z ]+)`", cell).group(1)


def inventory(tmp_path) -> str:
    p = tmp_path / "inv.yaml"
    p.write_text("version: 1\nhosts:\n  vm:\n    address: 127.0.0.1\n")
    return str(p)


# --- docs/cli.md against the tree -----------------------------------------------------------------------------------

def test_the_exit_code_table_has_one_row_per_command_and_each_help_has_its_exit_codes():
    rows = {command_of(r[0]): r for r in table("Exit codes")}
    assert set(rows) == set(LEAVES), set(rows) ^ set(LEAVES)
    for name in LEAVES:
        assert "Exit codes" in gpudoctor(*name.split(), "--help").stdout, name


def test_the_global_options_table_is_the_code():
    documented = {tuple(re.findall(r"`(-[-a-z]+)`", r[0])) for r in table("Global options")}
    assert documented == {opts for opts, _ in conventions.GLOBAL.values()}
    help_text = gpudoctor("--help").stdout
    for opts in documented:
        assert all(o in help_text for o in opts)


def test_every_command_with_json_is_in_the_json_table_and_the_rest_refuse_it():
    rows = {command_of(r[0]): r[1] for r in table("JSON")}
    with_json = {n for n, c in LEAVES.items()
                 if any("--json" in getattr(p, "opts", ()) and not p.hidden for p in c.params)}
    assert set(rows) == with_json
    for name in set(LEAVES) - with_json:
        assert f"`{name}`" in DOC.split("No JSON", 1)[1].split("\n\n")[0], name
        r = gpudoctor(*name.split(), *(["bash"] if name == "completion" else []), "--json")
        assert r.returncode == 3 and r.stdout == "" and "writes no JSON" in r.stderr, (name, r.stderr)
        assert len(r.stderr.splitlines()) == 1


# --- global options before or after ---------------------------------------------------------------------------------

def test_verbose_counts_wherever_it_is_given():
    from click.testing import CliRunner

    for args, level in ((["checks"], 0), (["-v", "checks"], 1), (["checks", "-v"], 1), (["-vv", "checks"], 2),
                        (["-v", "checks", "-v"], 2), (["checks", "-vv"], 2)):
        r = CliRunner().invoke(root, args)
        assert r.exit_code == 0, r.output
        assert conventions.last.verbose == level, args


def test_each_v_shows_more_and_q_nothing_but_errors():
    events = {}
    for flags in (["-q"], [], ["-v"], ["-vv"], ["-v", "-v"]):
        r = gpudoctor(*flags[:1], "check", "--timeout", "5", *flags[1:], timeout=120)  # a live check of this machine
        assert r.returncode in (0, 1, 2, 3) and "Traceback" not in r.stderr
        events[" ".join(flags)] = set(re.findall(r'^gpudoctor: [a-z]+: ([a-z_.]+)', r.stderr, re.M))  # plain lines
    assert "probe.finished" in events["-v"] and "command.finished" not in events["-v"]
    assert {"probe.finished", "command.finished"} <= events["-vv"] == events["-v -v"]  # -vv was -v (#41)
    assert "probe.finished" not in events["-q"] | events[""]


def test_logs_to_a_person_are_plain_lines_and_json_only_where_asked(tmp_path):
    """A warning into a pipe was a raw JSON object; `-vv` printed whole probe scripts (#49)."""
    inv = inventory(tmp_path)
    r = gpudoctor("daemon", "--once", "-i", inv, "--host", "vm", "--state", tmp_path / "d.json", timeout=120)
    warn = [ln for ln in r.stderr.splitlines() if "daemon.host_unreachable" in ln]
    assert warn and warn[0].startswith("gpudoctor: warning: daemon.host_unreachable host=vm error="), r.stderr
    j = gpudoctor("daemon", "--once", "-i", inv, "--host", "vm", "--state", tmp_path / "d.json", timeout=120,
                  env={**os.environ, "GPUDOCTOR_LOG_FORMAT": "json"})
    assert any(json.loads(ln).get("event") == "daemon.host_unreachable" for ln in j.stderr.splitlines()
               if ln.startswith("{")), j.stderr
    vv = gpudoctor("-vv", "check", "--timeout", "5", timeout=120)
    finished = [ln for ln in vv.stderr.splitlines() if "command.finished" in ln]
    assert finished and max(map(len, finished)) < 400, max(finished, key=len)[:500]  # a script: first line + length


def timeless(text: str) -> str:
    """A check report without this run's own replay time ("replayed in 0.13 s")."""
    return re.sub(r"replayed in [\d.]+ s", "replayed in T s", text)


def test_check_takes_v_after_its_name_and_json_before_it():
    plain = gpudoctor("check", "--snapshot", EXAMPLE)
    after = gpudoctor("check", "--snapshot", EXAMPLE, "-v")  # exit 3 "no such option: -v" before #41
    assert after.returncode == plain.returncode == 2 and timeless(after.stdout) == timeless(plain.stdout)
    before = gpudoctor("--json", "check", "--snapshot", EXAMPLE)
    assert before.returncode == 2 and json.loads(before.stdout)["schema"] == "gpudoctor.check/1"


def test_quiet_and_verbose_contradict():
    r = gpudoctor("-q", "check", "--snapshot", EXAMPLE, "-v")
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "-q and -v" in r.stderr


def test_inventory_short_option_before_or_after(tmp_path):
    inv = inventory(tmp_path)
    for args in (["-i", inv, "inventory", "show", "--json"], ["inventory", "show", "-i", inv, "--json"],
                 ["inventory", "show", "--json", "--inventory", inv], ["--json", "inventory", "show", "-i", inv]):
        r = gpudoctor(*args, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stderr)
        doc = json.loads(r.stdout)
        assert doc["schema"] == "gpudoctor.inventory/1" and doc["path"] == inv and "vm" in doc["hosts"]


def test_quiet_drops_the_note_on_stderr(tmp_path):
    inv = inventory(tmp_path)  # its one host does not answer (nothing listens on 127.0.0.1:22 here, or refuses us)
    r = gpudoctor("check", "--all", "-i", inv, "--json", "--host-timeout", "30", cwd=tmp_path)
    q = gpudoctor("-q", "check", "--all", "-i", inv, "--json", "--host-timeout", "30", cwd=tmp_path)
    assert r.returncode == q.returncode and json.loads(q.stdout)["schema"] == "gpudoctor.fleet/1"
    assert f"inventory: {inv}" in r.stderr and "inventory:" not in q.stderr


def test_color_always_and_never_into_a_pipe():
    on = gpudoctor("--color", "always", "check", "--snapshot", EXAMPLE)
    off = gpudoctor("check", "--snapshot", EXAMPLE, "--color=never", env={**os.environ, "FORCE_COLOR": "1"})
    assert "\x1b[" in on.stdout and "\x1b[" not in off.stdout
    bad = gpudoctor("--color", "sometimes", "checks")
    assert bad.returncode == 3 and "sometimes" in bad.stderr


# --- one name per concept: old spellings hidden, still accepted -----------------------------------------------------

def test_fix_snapshot_is_the_name_and_facts_still_works():
    new = gpudoctor("fix", "--snapshot", EXAMPLE, "--json")
    old = gpudoctor("fix", "--facts", EXAMPLE, "--json")
    assert new.returncode == old.returncode and new.stdout == old.stdout and json.loads(new.stdout)["plan"]
    help_text = gpudoctor("fix", "--help").stdout
    assert "--snapshot FILE" in help_text and "--facts" not in help_text


def test_check_a_is_all_findings_and_verbose_findings_still_works():
    new, old = gpudoctor("check", "--snapshot", EXAMPLE, "-a"), gpudoctor("check", "--snapshot", EXAMPLE, "--verbose-findings")
    assert timeless(new.stdout) == timeless(old.stdout) and new.returncode == old.returncode == 2
    assert timeless(gpudoctor("check", "--snapshot", EXAMPLE, "--all-findings").stdout) == timeless(new.stdout)
    help_text = gpudoctor("check", "--help").stdout
    assert "-a, --all-findings" in help_text and "--verbose-findings" not in help_text


def test_bench_load_model_name():
    help_text = gpudoctor("bench", "load", "--help").stdout
    assert "--model-name NAME" in help_text and not re.search(r"--model\b(?!-)", help_text)


# --- subcommands ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, near", [(["chek"], "check"), (["bench", "lod"], "load"), (["lxc", "audti"], "audit"),
                                        (["sglang", "valdate"], "validate")])
def test_a_mistyped_command_names_the_nearest(args, near):
    r = gpudoctor(*args)
    assert r.returncode == 3 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert f"Did you mean '{near}'?" in r.stderr and r.stderr.count("Did you mean") == 1


@pytest.mark.parametrize("path", GROUPS, ids=lambda p: " ".join(p))
def test_group_summaries_are_whole_sentences(path):
    out = gpudoctor(*path, "--help").stdout
    listed = out.split("Commands:\n", 1)[1]
    entries = re.split(r"\n  (?=\S)", "\n" + listed.strip("\n"))[1:] if listed.startswith("  ") else []
    assert entries
    for e in entries:
        text = " ".join(e.split()[1:])
        assert not text.endswith("...") and text.endswith((".", "?")), (path, e)


# --- help ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(LEAVES))
def test_help_prints_no_control_characters(name):
    out = gpudoctor(*name.split(), "--help").stdout
    assert "\\x08" not in out and "\b" not in out


def test_bench_standin_documents_every_option():
    out = gpudoctor("bench", "standin", "--help").stdout
    options = out.split("options:\n", 1)[1].split("\n\n")[0].splitlines()
    bare = [ln for i, ln in enumerate(options) if ln.startswith("  -") and len(ln.split("  ")) < 3
            and (i + 1 == len(options) or not options[i + 1].startswith(" " * 10))]
    assert bare == []
    assert "Exit codes" in out


def test_version_names_the_commit():
    r = gpudoctor("--version")
    assert r.returncode == 0 and re.fullmatch(r"gpudoctor \S+ \(commit ([0-9a-f]{12}|unknown)\)\n", r.stdout)


def test_the_commit_comes_from_the_install_stamp_else_unknown(tmp_path, monkeypatch):
    from gpudoctor import buildinfo

    monkeypatch.setattr(buildinfo, "__file__", str(tmp_path / "pkg" / "gpudoctor" / "buildinfo.py"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert buildinfo.commit() == "unknown"  # neither stamp nor checkout: never an error
    (tmp_path / buildinfo.STAMP).write_text("0123456789abcdef0123456789abcdef01234567\n")
    assert buildinfo.commit() == "0123456789ab"
    (tmp_path / buildinfo.STAMP).write_text("$(reboot)\n")
    assert buildinfo.commit() == "unknown"


# --- JSON -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, schema, code", [
    (["check", "--explain", "devices.node.major", "--json"], "gpudoctor.check-explain/1", 0),
    (["check", "--explain", "devices.node.major[/dev/nvidia-uvm]", "--json"], "gpudoctor.check-explain/1", 0),
    (["checks", "--json"], "gpudoctor.checks/1", 0),
    (["sglang", "explain", str(LOGS / "max-running-zero-hybrid.log"), "--json"], "gpudoctor.sglang-explain/1", 0),
    (["sglang", "explain", str(LOGS / "unknown.log"), "--json"], "gpudoctor.sglang-explain/1", 1),
    (["bench", "compare", str(REPO / "tests/fixtures/bench2/campaign:method=baseline"),
      str(REPO / "tests/fixtures/bench2/campaign:method=eagle3"), "--json"], "gpudoctor.bench-compare/1", 0),
])
def test_json_carries_its_schema(args, schema, code):
    r = gpudoctor(*args)
    assert r.returncode == code, r.stderr
    assert json.loads(r.stdout)["schema"] == schema


def test_gate_npd_refuses_json_in_its_one_line():
    r = gpudoctor("gate", "--npd", "--json", "--snapshot", EXAMPLE)
    assert r.returncode == 2 and len(r.stdout.splitlines()) == 1 and "--json" in r.stdout  # NPD: 2 is unknown


def test_model_verify_and_stage_json(tmp_path):
    from tests.model.test_model_stage import write_model

    write_model(tmp_path / "m", shards=2)
    v = gpudoctor("model", "verify", tmp_path / "m", "--json")
    assert v.returncode == 0 and json.loads(v.stdout)["schema"] == "gpudoctor.model-verify/1"


def test_snapshot_writes_to_a_pipe_without_o(tmp_path):
    r = gpudoctor("snapshot", "--timeout", "5", timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == "gpudoctor.snapshot/1"


# --- Ctrl-C -----------------------------------------------------------------------------------------------------------

def _interrupt(args, wait_s: float = 2.0, **kw) -> subprocess.CompletedProcess:
    p = subprocess.Popen([console_script(), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, **kw)
    time.sleep(wait_s)
    assert p.poll() is None, p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(args, p.returncode, out, err)


def test_ctrl_c_while_reading_a_log_is_130_and_one_line():
    r = _interrupt(["sglang", "explain", "-"])  # waits on stdin, which stays open
    assert (r.returncode, r.stderr) == (130, "gpudoctor: interrupted\n")  # it was 3, "Aborted."


def test_ctrl_c_while_waiting_for_a_server_is_130_and_one_line(tmp_path):
    with socket.socket() as s:  # accepts connections, never answers: bench load waits for it to be ready
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        r = _interrupt(["bench", "load", "--server-url", url, "--max-tokens", "4", "--context-limit", "4096",
                        "--ready-timeout", "120", "--out", str(tmp_path / "out")], wait_s=3.0)
    assert r.returncode == 130, r.stderr
    assert r.stderr.splitlines()[-1] == "gpudoctor: interrupted" and "Traceback" not in r.stderr


# --- completion and manual ----------------------------------------------------------------------------------------

def test_clicks_completion_hook_works():
    r = gpudoctor(env={**os.environ, "_GPUDOCTOR_COMPLETE": "bash_source"})  # it crashed with a TypeError
    assert r.returncode == 0 and "_gpudoctor_completion" in r.stdout and r.stderr == ""
    assert gpudoctor("completion", "bash").stdout == r.stdout


def test_bash_completes_commands_and_options_through_the_script():
    script = gpudoctor("completion", "bash").stdout
    bin_dir = str(Path(console_script()).parent)

    def complete(*words: str) -> list[str]:
        prog = (f"{script}\nCOMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; _gpudoctor_completion gpudoctor; "
                'printf "%s\\n" "${COMPREPLY[@]}"')
        r = subprocess.run(["bash", "--norc", "-c", prog], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"})
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("gpudoctor", "ch") == ["check", "checks"]
    assert "--snapshot" in complete("gpudoctor", "fix", "--sn")
    assert complete("gpudoctor", "completion", "z") == ["zsh"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts(shell):
    r = gpudoctor("completion", shell)
    assert r.returncode == 0 and "_GPUDOCTOR_COMPLETE" in r.stdout


def test_the_manual_is_built_from_every_command_and_option():
    r = gpudoctor("manpage")
    assert r.returncode == 0 and r.stdout.startswith(".TH GPUDOCTOR 1")
    for name, cmd in LEAVES.items():
        assert f'.SS "gpudoctor {name}"' in r.stdout, name
        ctx = click.Context(cmd, info_name=name)
        for p in cmd.get_params(ctx):
            rec = p.get_help_record(ctx)
            if rec:
                assert rec[0].replace("\\", "\\e") in r.stdout, (name, rec[0])


def test_man_renders_the_manual(tmp_path):
    import shutil

    if not shutil.which("man") or not shutil.which("groff"):
        from tests.needs import missing

        missing("man", "man-db and groff")
    page = tmp_path / "gpudoctor.1"
    page.write_text(gpudoctor("manpage").stdout)
    r = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "MANPAGER": "cat", "MANWIDTH": "100"})
    assert r.returncode == 0 and "gpudoctor check" in r.stdout and "GLOBAL OPTIONS" in r.stdout
    assert "warning" not in r.stderr.lower(), r.stderr


# --- small cuts: units and plurals --------------------------------------------------------------------------------

def test_inventory_show_says_1_gpu(tmp_path):
    p = tmp_path / "inv.yaml"
    p.write_text("version: 1\nhosts:\n  vm:\n    address: 127.0.0.1\n    expect:\n      gpus: 1\n")
    out = gpudoctor("inventory", "show", "-i", p).stdout
    assert " 1 GPU " in out + " " and "1 GPUs" not in out


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_no_help_shows_an_old_spelling(name):
    out = gpudoctor(*name.split(), "--help").stdout
    shown = re.findall(r"(?<![\w-])--[a-z][-a-z]*", out)
    assert not set(shown) & set(conventions.RENAMED), name


def test_an_old_spelling_declared_anywhere_gains_the_new_name(tmp_path):
    from click.testing import CliRunner

    @click.command()
    @click.option("--facts", "facts_path")
    @click.option("--verbose-findings", "-a", "show_all", is_flag=True)
    def probe(facts_path, show_all):
        click.echo(f"{facts_path} {show_all}")

    conventions.adopt(probe)
    for args in (["--snapshot", "x", "--all-findings"], ["--facts", "x", "-a"], ["--facts", "x", "--verbose-findings"]):
        assert CliRunner().invoke(probe, args).output == "x True\n", args
    help_text = CliRunner().invoke(probe, ["--help"]).output
    assert "--snapshot" in help_text and "-a, --all-findings" in help_text
    assert "--facts" not in help_text and "--verbose-findings" not in help_text


def test_quiet_check_shows_only_what_is_not_ok_and_the_verdict():
    """-q (before or after the command): check's text keeps the verdict, the root cause and the rows that are not ok;
    no healthy row. The exit code is the same."""
    plain = gpudoctor("check", "--snapshot", EXAMPLE)
    for args in (["-q", "check", "--snapshot", EXAMPLE], ["check", "--snapshot", EXAMPLE, "-q"]):
        q = gpudoctor(*args)
        assert q.returncode == plain.returncode == 2
        assert q.stdout.splitlines()[0].startswith("gpudoctor check vm: FAIL (exit 2)")
        rows = [ln for ln in q.stdout.splitlines() if re.match(r"^\S+\s+(ok|OK)\s", ln)]
        assert rows == [] and re.search(r"(?m)^\S+\s+ok\s", plain.stdout)
        assert "devices.node.major[/dev/nvidia-uvm]" in q.stdout and len(q.stdout) < len(plain.stdout)
