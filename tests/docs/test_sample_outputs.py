"""The README's and docs' sample outputs are what the product prints (#19, acceptance 2).

Every fenced block in README.md and docs/*.md whose first line is `$ gpudoctor ...` (a trailing `# comment` and `\\`
continuations allowed) is a sample: the command runs for real from the repository root, on the committed snapshots,
configs and logs it names, and the block's lines must be the head of its output, in order. Durations are compared as
"<t> s"; a line that is just `...` (or `…`) skips output lines; a line ending in `...` or `…` is a prefix; a
`$ echo $?` line and the number after it are the exit code. A block that shows a real host's output, which no
committed input reproduces, says so on the line before it: `<!-- sample from a live host: WHY -->`; it is not run,
and test_live_only_samples_say_why lists them. A doc that drifts from the
product fails here, with the first line that differs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LIVE_ONLY = "<!-- sample from a live host:"  # the marker, with the reason, on the line before the fence
_TIME = re.compile(r"\b\d+(?:\.\d+)? (s|ms)\b")


def samples():
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in _FENCE.finditer(text):
            lines = m.group(1).splitlines()
            if not lines or not lines[0].startswith("$ gpudoctor "):
                continue
            before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
            if before.startswith(LIVE_ONLY):  # output of a real host that no committed input reproduces
                continue
            cmd, i = lines[0][2:], 1
            while cmd.rstrip().endswith("\\") and i < len(lines):
                cmd, i = cmd.rstrip()[:-1] + " " + lines[i].strip(), i + 1
            body = lines[i:]
            rc = None
            if "$ echo $?" in body:  # the sample also shows the exit code
                k = body.index("$ echo $?")
                body, rc = body[:k], int(body[k + 1])
            lineno = text[:m.start()].count("\n") + 2
            out.append(pytest.param(cmd, body, rc, id=f"{doc.relative_to(ROOT)}:{lineno}"))
    return out


def _norm(line: str) -> str:
    return _TIME.sub(r"<t> \1", line.rstrip())


def _run(cmd: str) -> tuple[int, str]:
    argv = shlex.split(cmd, comments=True)
    assert argv[0] == "gpudoctor"
    env = dict(os.environ, NO_COLOR="1", TERM="dumb", COLUMNS="120")
    env.pop("GPUDOCTOR_INVENTORY", None)
    r = subprocess.run([sys.executable, "-m", "gpudoctor", *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                       env=env, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, r.stdout + r.stderr


def mismatch(expected: list[str], got: list[str]) -> str | None:
    """None when `expected` is the head of `got` under the rules above, else the first difference."""
    j = 0
    skipping = False
    for n, want in enumerate(expected, 1):
        w = _norm(want)
        if w.strip() in ("...", "…"):
            skipping = True
            continue
        prefix = w.endswith(("...", "…"))
        if prefix:
            w = w[:-3] if w.endswith("...") else w[:-1]

        def ok(line: str) -> bool:
            g = _norm(line)
            return g.startswith(w) if prefix else g == w

        while skipping and j < len(got) and not ok(got[j]):
            j += 1
        skipping = False
        if j >= len(got):
            return f"sample line {n} {want!r}: the output ended"
        if not ok(got[j]):
            return f"sample line {n}:\n  doc:    {want!r}\n  output: {got[j]!r}"
        j += 1
    return None


@pytest.mark.parametrize("cmd, expected, rc", samples())
def test_sample_output_is_what_the_command_prints(cmd, expected, rc):
    assert expected, "a sample with a command but no output"
    code, text = _run(cmd)
    problem = mismatch(expected, text.splitlines())
    assert problem is None, f"$ {cmd}\n{problem}"
    assert rc is None or code == rc, f"$ {cmd}: exit {code}, the doc says {rc}"


def test_live_only_samples_say_why():
    marked = [(doc.name, ln) for doc in DOCS for ln in doc.read_text().splitlines() if ln.startswith(LIVE_ONLY)]
    for name, ln in marked:
        assert ln.endswith("-->") and len(ln) > len(LIVE_ONLY) + 10, f"{name}: {ln!r} gives no reason"


def test_the_samples_are_found():
    ids = [p.id for p in samples()]
    assert any(i.startswith("README.md:") for i in ids) and any(i.startswith("docs/lxc.md:") for i in ids)


def test_the_matcher_catches_drift():
    got = ["gpudoctor check vm: FAIL (exit 2) in 0.17 s", "", "Root cause x: y", "    chain: a → b"]
    assert mismatch(["gpudoctor check vm: FAIL (exit 2) in 0.18 s", "", "Root cause x: y"], got) is None
    assert mismatch(["gpudoctor check vm: FAIL (exit 2) in 9 s", "...", "    chain: a → b"], got) is None
    assert mismatch(["Root cause x: ..."], got[2:]) is None
    assert "chain" in mismatch(["gpudoctor check vm: FAIL (exit 2) in 0.1 s", "", "Root cause x: y",
                                "    chain: a → c"], got)
    assert mismatch(["gpudoctor check vm: WARN (exit 1) in 0.1 s"], got) is not None


def test_docs_checks_md_is_what_checks_markdown_prints():
    """docs/checks.md says it is generated by `gpudoctor checks --markdown`: it must be that output exactly."""
    code, text = _run("gpudoctor checks --markdown")
    assert code == 0
    assert (ROOT / "docs" / "checks.md").read_text() == text, \
        "docs/checks.md drifted: regenerate it with `gpudoctor checks --markdown > docs/checks.md`"


def test_readme_snapshot_table_verdicts_are_what_check_says():
    """README's "Try it on real captures" table: each snapshot's verdict word is `check --snapshot`'s."""
    rows = re.findall(r"^\| `(h200[^`]*\.json)` \| (ok|warn|fail|unknown)\b", (ROOT / "README.md").read_text(), re.M)
    assert len(rows) >= 4
    for name, word in rows:
        code, text = _run(f"gpudoctor check --snapshot examples/{name}")
        assert text.splitlines()[0].split(": ", 1)[1].startswith(word.upper() if word != "ok" else "ok"), (name, text[:200])
        assert code == {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}[word], name
