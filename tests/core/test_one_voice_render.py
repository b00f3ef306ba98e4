"""#41 "one voice", the renderer's part: one renderer for findings (check, gate, fix, daemon --once, lxc audit).

To a terminal (a real pty, 80 and 200 columns) lines fold at the width and at spaces only: an id, a path or a
number is never split. To a pipe, nothing folds: one finding is one line, so `grep CHECK_ID` finds it whole.
Colours by one rule everywhere (FAIL/BLOCK/REFUSED in bold red on a colour terminal, never on a pipe). Healthy rows
say how many subjects they cover; `quiet` shows only what is not ok; the deep tier shows every figure by default;
a replay says which duration is whose; check's remedy line is what fix would do, and both count root causes alike.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.console import drain

from gpudoctor.diagnose import Diagnosis
from gpudoctor.findings import Finding, Status
from gpudoctor.report import render
from gpudoctor.term import Styled

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SNAPSHOTS = ROOT / "tests" / "fixtures" / "snapshots"
UVM = str(EXAMPLES / "h200-uvm-blocked.json")
DEEP = str(EXAMPLES / "h200-deep-healthy.json")
UNIT = str(SNAPSHOTS / "systemd-sglang-uvm-510.json")
SEED = ["--config", str(ROOT / "tests/fixtures/proxmox/configs/200-seed.conf"),
        "--devices", str(ROOT / "tests/fixtures/proxmox/proc-devices-uvm511.txt")]
SGR = re.compile(r"\x1b\[[0-9;]*m")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "TERM")}
    return {**env, "TERM": "xterm", **extra}


def on_pipe(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, timeout=120,
                          env=_env(**env), cwd=ROOT)


def on_pty(cols: int, *args) -> tuple[int, str]:
    """The real CLI with its stdout a terminal `cols` wide: (exit code, what the terminal got, newlines as \\n)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: size its terminal, then become gpudoctor
        try:
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
            os.chdir(ROOT)
            os.execve(sys.executable, [sys.executable, "-m", "gpudoctor", *args], _env())
        finally:
            os._exit(127)
    raw = drain(fd, 120)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), raw.decode(errors="replace").replace("\r\n", "\n")


def bad_findings(path: str) -> list[dict]:
    r = on_pipe("check", "--snapshot", path, "--json")
    return [f for f in json.loads(r.stdout)["findings"] if f["status"] in ("fail", "warn", "unknown")]


# --- to a terminal ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cols", [80, 200])
def test_on_a_terminal_lines_fold_at_its_width_and_never_split_a_token(cols):
    code, raw = on_pty(cols, "check", "--snapshot", UVM)
    assert code == 2, raw[-2000:]
    assert "\x1b[1;31mFAIL\x1b[0m" in raw  # the status word in its colour
    text = SGR.sub("", raw)
    lines = text.splitlines()
    head = next(ln for ln in lines if ln.startswith("layer"))
    fcol = head.index("finding")
    for ln in lines:
        # a line wider than the terminal is one token alone at its indent (kept whole: never split)
        assert len(ln) <= cols or len(ln[fcol:].split()) == 1 or len(ln.split()) == 1, (cols, ln)
    tokens = {t for ln in lines for t in ln.split()}
    for f in bad_findings(UVM):
        assert f["key"] in tokens, f"{f['key']} split at {cols} columns"
        for word in f["summary"].split():  # every word of every summary arrives whole
            assert word in tokens, (word, cols)
    for path in ("/dev/nvidia-uvm", "/proc/devices", "/usr/local/nvidia/lib64/libcuda.so.580.159.04"):
        assert any(path in t for t in tokens)
    if cols == 200:  # wide enough: the finding sentence is one line
        assert any(ln.rstrip().endswith("/dev/nvidia-uvm is 1:3, but the live nvidia-uvm device is 238:0")
                   and "devices.node.major[/dev/nvidia-uvm]" in ln for ln in lines)


def test_a_hostile_path_does_not_grow_the_output():
    """A 400-character path (a subject) at 80 columns: on main its key was folded into 14 lines of the check
    column; it is now one line, the finding folded beside or below it."""
    path = "/dev/shm/" + "a" * 391
    fs = [Finding("workload.model.files", Status.FAIL, "model incomplete", subject=path, layer="workload"),
          Finding("host.privileges", Status.OK, "Probes run as root", layer="host")]
    buf = io.StringIO()
    render(Diagnosis("h1", fs, [fs[0]], [fs[0].key]), Styled(buf, width=80, color=False))
    lines = buf.getvalue().splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if ln.startswith("layer")):]
    assert len(table) <= 4, table
    assert any(f"workload.model.files[{path}]" in ln for ln in table)


# --- to a pipe ----------------------------------------------------------------------------------------------------

def test_to_a_pipe_each_finding_is_one_line_that_grep_finds_whole():
    r = on_pipe("check", "--snapshot", UVM)
    assert r.returncode == 2 and "\x1b" not in r.stdout
    for f in bad_findings(UVM):
        [row] = [ln for ln in r.stdout.splitlines() if f["key"] in ln.split()]  # grep KEY: exactly one row
        assert row.split(f["key"], 1)[1].strip().startswith(f["summary"])  # the whole sentence on it
    # COLUMNS set by the shell does not fold a pipe
    body = r.stdout.split("\n", 1)[1]  # after the verdict line and its replay time
    assert on_pipe("check", "--snapshot", UVM, COLUMNS="60").stdout.split("\n", 1)[1] == body


def test_gate_fix_and_lxc_audit_colour_fail_words_on_a_terminal_only():
    for args, word in ((["gate", "--snapshot", UVM], "BLOCK"), (["fix", "--facts", UVM], "REFUSED"),
                       (["lxc", "audit", *SEED], "FAIL")):
        _, raw = on_pty(80, *args)
        assert f"\x1b[1;31m{word}\x1b[0m" in raw, (args, raw[:500])
        piped = on_pipe(*args)
        assert "\x1b" not in piped.stdout and f"{word} " in piped.stdout
        assert f"\x1b[1;31m{word}" in on_pipe(*args, FORCE_COLOR="1").stdout  # the same rule as check's


def test_gate_lines_fold_on_a_terminal_and_stay_one_line_on_a_pipe():
    piped = on_pipe("gate", "--snapshot", UVM).stdout.splitlines()
    assert [ln.split(":")[0] for ln in piped] == ["BLOCK devices.node.major[/dev/nvidia-uvm]", "BLOCK cuda.init"]
    assert max(map(len, piped)) > 200  # the hint makes it long: still one line
    _, raw = on_pty(80, "gate", "--snapshot", UVM)
    lines = SGR.sub("", raw).splitlines()
    assert all(len(ln) <= 80 for ln in lines) and len(lines) > 2
    assert " ".join(ln.strip() for ln in lines).startswith(piped[0])  # the same words, folded at spaces


# --- what the rows say ---------------------------------------------------------------------------------------------

def test_a_healthy_row_says_how_many_subjects_it_covers_and_a_lists_them():
    out = on_pipe("check", "--snapshot", UVM).stdout
    [row] = [ln for ln in out.splitlines() if re.search(r"\bok\s+devices\.node\.major\s", ln)]
    assert "5 nodes: /dev/nvidia-caps/nvidia-cap1, " in row and "(-a lists them)" in row
    every = on_pipe("check", "-a", "--snapshot", UVM).stdout
    majors = [ln for ln in every.splitlines() if re.search(r"\bok\s+devices\.node\.major\[", ln)]
    assert len(majors) == 5 and any("devices.node.major[/dev/nvidia-uvm-tools]" in ln for ln in majors)


def test_quiet_shows_only_what_is_not_ok_plus_the_verdict():
    bad = Finding("devices.node.major", Status.FAIL, "/dev/nvidia-uvm is 1:3", subject="/dev/nvidia-uvm",
                  layer="devices")
    fs = [bad, Finding("host.privileges", Status.OK, "Probes run as root", layer="host"),
          Finding("devices.node.mode", Status.OK, "mode 0666", subject="/dev/nvidia0", layer="devices")]
    buf = io.StringIO()
    render(Diagnosis("h1", fs, [bad], [bad.key]), Styled(buf, width=120, color=False), quiet=True)
    out = buf.getvalue()
    assert out.startswith("gpudoctor check h1: FAIL (exit 2)")
    assert "devices.node.major[/dev/nvidia-uvm]" in out and "host.privileges" not in out and "mode 0666" not in out
    buf = io.StringIO()
    render(Diagnosis("h2", fs[1:], [], []), Styled(buf, width=120, color=False), quiet=True)
    assert buf.getvalue().strip() == "gpudoctor check h2: ok (exit 0)"  # healthy and quiet: the verdict alone


def test_the_deep_tier_shows_every_figure_by_default_and_no_sentence_twice():
    out = on_pipe("check", "--snapshot", DEEP).stdout
    for figure in ("H2D pinned 53.0 GB/s", "D2H pinned 55.3 GB/s", "device copy 4230 GB/s", "bf16 GEMM 798.0",
                   "NCCL initialises and all-reduces"):
        assert figure in out, figure
    every = on_pipe("check", "-a", "--snapshot", DEEP).stdout.splitlines()
    [gemm] = [i for i, ln in enumerate(every) if "fabric.deep.figure[GPU 0 gemm]" in ln]
    sentence = "bf16 GEMM 798.0 TFLOP/s = 0.81 of the H200 SXM's dense bf16 peak (989.0 TFLOP/s), floor 0.72"
    block = every[gemm:gemm + 6]
    assert sum(sentence in ln for ln in block) == 1, block  # the summary, not repeated as its own evidence
    assert not any("0 MiB" in ln for ln in block)  # a GEMM moves no buffer


def test_a_replay_says_which_duration_was_recorded_and_which_is_its_own():
    first = on_pipe("check", "--snapshot", UVM).stdout.splitlines()[0]
    assert re.fullmatch(r"gpudoctor check vm: FAIL \(exit 2\) \(recorded in 0\.17 s; replayed in \d+\.\d\d s\)",
                        first), first


def test_explain_accepts_the_key_as_the_table_prints_it():
    plain = on_pipe("check", "--explain", "devices.node.major")
    keyed = on_pipe("check", "--explain", "devices.node.major[/dev/nvidia-uvm]")
    assert keyed.returncode == 0 and keyed.stdout == plain.stdout and plain.stdout.startswith("devices.node.major")


def test_daemon_cycle_speaks_as_check_does():
    from gpudoctor.report import daemon_cycle

    f = Finding("devices.node.major", Status.FAIL, "/dev/nvidia-uvm is 1:3", subject="/dev/nvidia-uvm",
                evidence=["stat /dev/nvidia-uvm → 1:3"], hint="mknod it", layer="devices")
    buf = io.StringIO()
    daemon_cycle(Styled(buf, width=None, color=True), {"ct200": {"verdict": "fail", "root_causes": [f]}})
    out = buf.getvalue()
    assert "\x1b[1;31mFAIL\x1b[0m" in out and "devices.node.major[/dev/nvidia-uvm]" in out
    plain = SGR.sub("", out).splitlines()
    assert plain[:4] == ["ct200: FAIL", "  FAIL devices.node.major[/dev/nvidia-uvm]: /dev/nvidia-uvm is 1:3",
                         "      evidence: stat /dev/nvidia-uvm → 1:3", "      fix: mknod it"]


# --- check and fix: one plan, one count ----------------------------------------------------------------------------

def test_check_and_fix_count_root_causes_with_one_sentence():
    """On main fix said "6 other root cause(s) need a human" where check listed 7 others under "also:"."""
    check = on_pipe("check", "--snapshot", UNIT).stdout.splitlines()
    fix = on_pipe("fix", "--facts", UNIT).stdout.splitlines()
    [c] = [ln.strip() for ln in check if ln.strip().startswith("no remedy: ")]
    [f] = [ln for ln in fix if ln.startswith("no remedy: ")]
    assert c == f and f.startswith("no remedy: 6 of 8 root cause(s) need a human: ")
    [also] = [ln.strip() for ln in check if ln.strip().startswith("also: ")]
    assert also.startswith("also: 7 other root cause(s): ")


def test_other_commands_long_lines_fold_at_a_terminals_width_the_same_way():
    """`gpudoctor checks` prints lines of 150-230 characters: on a terminal they fold at its width, at spaces (the
    one rule, in term.SafeStream under every command); to a pipe they stay whole, and JSON is never folded."""
    piped = on_pipe("checks").stdout.splitlines()
    assert max(map(len, piped)) > 150
    _, raw = on_pty(80, "checks")
    lines = raw.splitlines()
    assert all(len(ln) <= 80 or len(ln.split()) == 1 for ln in lines)
    assert " ".join(" ".join(lines).split()) == " ".join(" ".join(piped).split())  # the same words, none split
    _, js = on_pty(80, "checks", "--json")
    assert json.loads(js)["checks"][0]["id"] == "host.driver.loaded"


def test_checks_triage_costs_a_failing_check_no_logging_import():
    """check plans its root causes' remedies read-only; it must not pull in the engine's structlog (a fifth of a
    second on a loaded machine) to do it."""
    prog = ("import sys\nfrom gpudoctor.cli import main\ntry:\n    main(['check', '--snapshot', sys.argv[1]])\n"
            "except SystemExit:\n    pass\nprint('MODS', sorted(m for m in sys.modules if m.split('.')[0] in "
            "('rich', 'structlog')))")
    r = subprocess.run([sys.executable, "-c", prog, UVM], capture_output=True, text=True, timeout=120)
    assert "no remedy here: `gpudoctor fix --only devices.node.create` refuses" in r.stdout, r.stderr
    assert r.stdout.rstrip().splitlines()[-1] == "MODS []"
