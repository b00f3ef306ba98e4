"""The text report of `gpudoctor check` (gpudoctor/report.py render, findings_table) written by gpudoctor.term.Styled,
without rich (issue #33: rich's Table measured every cell twice, 18-27 ms, and importing rich.console was 72 ms, of a
0.25 s check on the H200): the same columns, alignment and folding as before, styles only on a colour terminal, and
the terminal rule: every value escaped, nothing of the input raw."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from gpudoctor.diagnose import Diagnosis
from gpudoctor.findings import Finding, Status
from gpudoctor.report import render
from gpudoctor.term import Styled, fold

LONG = ("/dev/nvidia-uvm was missing when probed; cuInit still succeeded (libcuda's nvidia-modprobe can recreate it "
        "where mknod is allowed)")


def findings():
    return [
        Finding("host.driver.loaded", Status.FAIL, "No NVIDIA driver is loaded", evidence=["/proc/modules → ENOENT"]),
        Finding("host.privileges", Status.OK, "Probes run as root"),
        Finding("devices.node.present", Status.WARN, LONG, subject="/dev/nvidia-uvm-tools",
                evidence=["stat /dev/nvidia-uvm-tools → ENOENT", "cuInit(0) → 0"], blocked_by="host.driver.loaded"),
        Finding("cuda.init", Status.OK, "cuInit ok: 1 device(s), driver API 13000"),
    ]


def rendered(fs, width=120, color=False, verbose=False) -> str:
    buf = io.StringIO()
    render(Diagnosis("h1", fs, [fs[0]], [fs[0].key]), Styled(buf, width=width, color=color), verbose=verbose)
    return buf.getvalue()


def table(out: str) -> list[str]:
    lines = out.splitlines()
    return lines[next(i for i, ln in enumerate(lines) if ln.startswith("layer")):]


def test_columns_are_aligned_and_the_finding_folds_within_the_width():
    t = table(rendered(findings()))
    head = t[0]
    col = {name: head.index(name) for name in ("layer", "status", "check", "finding")}
    # each column as wide as its longest cell ("devices", "status", the longest key), two spaces between
    widest = len("devices.node.present[/dev/nvidia-uvm-tools]")
    assert col == {"layer": 0, "status": 9, "check": 17, "finding": 17 + widest + 2}
    row = next(ln for ln in t if "devices.node.present" in ln)
    assert row[col["status"]:].startswith("WARN") and row[col["check"]:].startswith("devices.node.present[")
    assert row[col["finding"]:].startswith("/dev/nvidia-uvm was missing")
    assert all(len(ln) <= 120 for ln in t) and all(ln == ln.rstrip() for ln in t)
    body = t[t.index(row):]
    cont = body[1:body.index(next(ln for ln in body if ln.startswith("cuda")))]
    # the summary folds onto lines indented to the finding column; the symptom note and each evidence line follow
    assert all(ln[:col["finding"]].strip() == "" for ln in cont)
    text = " ".join(ln.strip() for ln in [row[col["finding"]:], *cont])
    assert text.startswith(LONG + " (symptom of host.driver.loaded)")
    assert text.endswith("stat /dev/nvidia-uvm-tools → ENOENT cuInit(0) → 0")
    assert t[-1].startswith("cuda     ok      cuda.init")
    assert [ln.split()[0] for ln in t[1:] if ln[:1] != " "] == ["host", "devices", "cuda"]  # a layer named once


def test_a_narrow_terminal_narrows_the_check_column_but_never_splits_a_key():
    """#41: a key wider than its narrowed column is printed whole; its finding starts on the line below."""
    t = table(rendered(findings(), width=60))
    c, f = t[0].index("check"), t[0].index("finding")
    assert f - c - 2 < len("devices.node.present[/dev/nvidia-uvm-tools]") and 60 - f >= 30
    [row] = [i for i, ln in enumerate(t) if "devices.node.present" in ln]
    assert t[row][c:] == "devices.node.present[/dev/nvidia-uvm-tools]"  # whole, alone on its line
    assert t[row + 1][:f].strip() == "" and t[row + 1][f:].startswith("/dev/nvidia-uvm was missing")
    assert all(len(ln) <= 60 for i, ln in enumerate(t) if i != row)


def test_every_value_is_escaped_and_colours_are_gpudoctors_own():
    evil = Finding("host.platform", Status.FAIL, "pwned\x1b[2J\x1b]0;title\x07", subject="ct\x1b[1A\rFAIL",
                   evidence=["line\x1b[31mred", "[bold]not markup[/]"], blocked_by="x\x1b[K")
    out = rendered([evil, *findings()], color=True)
    assert "\x1b[2J" not in out and "\x07" not in out and "\r" not in out and "\x1b[1A" not in out
    assert "pwned\\x1b[2J\\x1b]0;title\\x07" in out and "ct\\x1b[1A\\rFAIL" in out
    assert "line\\x1b[31mred" in out and "[bold]not markup[/]" in out  # shown as written, never interpreted
    assert "\x1b[1;31mFAIL" in out  # the status word in its colour (gpudoctor's own escape codes pass)


@pytest.mark.parametrize("text, width, lines", [
    ("No NVIDIA driver is loaded and the quick brown fox", 20, ["No NVIDIA driver is", "loaded and the quick", "brown fox"]),
    # #41: a token longer than the width is never split: it stays whole on a line of its own
    ("ab averyveryverylongword cd", 10, ["ab", "averyveryverylongword", "cd"]),
    ("    evidence: x y", 8, ["    evidence:", "x y"]),  # the first line keeps its indent, no line of spaces
    ("a  b  c", 3, ["a", "b", "c"]),
    ("模型 名称 很长的目录", 8, ["模型", "名称", "很长的目录"]),  # wide characters take two cells each
    ("/dev/nvidia-uvm-tools devices.node.present[/dev/nvidiactl] 1:3", 12,
     ["/dev/nvidia-uvm-tools", "devices.node.present[/dev/nvidiactl]", "1:3"]),
    ("", 8, [""]),
])
def test_fold_breaks_at_spaces_only(text, width, lines):
    assert [text[a:b] for a, b in fold(text, width)] == lines


@pytest.mark.parametrize("env, tty, colour", [
    ({}, True, True), ({}, False, False), ({"NO_COLOR": "1"}, True, False), ({"TERM": "dumb"}, True, False),
    ({"FORCE_COLOR": "1"}, False, True),
])
def test_styles_reach_only_a_colour_terminal_as_rich_decided(monkeypatch, env, tty, colour):
    for k in ("NO_COLOR", "FORCE_COLOR", "TERM", "COLUMNS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    class Stream(io.StringIO):
        def isatty(self):
            return tty

    buf = Stream()
    Styled(buf, width=40).print(("FAIL", "bold red"), " x")
    assert buf.getvalue() == ("\x1b[1;31mFAIL\x1b[0m x\n" if colour else "FAIL x\n")
    monkeypatch.setenv("COLUMNS", "57")
    # a terminal folds at $COLUMNS; a pipe or file never folds (#41: one line stays one line for grep)
    assert Styled(buf).width == (57 if tty else None)


def test_the_text_report_does_not_import_rich(tmp_path):
    """A whole `check` text report, here of a snapshot, without rich in the process (`--json` never needed it)."""
    from tests.core import deep_captures as dc

    snap = dc.write(dc.build(dc.healthy_child()), tmp_path / "deep.json")
    prog = ("import sys\nfrom gpudoctor.cli import main\ntry:\n    main(['check', '--snapshot', sys.argv[1]])\n"
            "except SystemExit:\n    pass\nprint('RICH', sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))")
    r = subprocess.run([sys.executable, "-c", prog, str(snap)], capture_output=True, text=True, timeout=120)
    assert "gpudoctor check" in r.stdout and "layer" in r.stdout, r.stderr
    assert r.stdout.rstrip().splitlines()[-1] == "RICH []"
