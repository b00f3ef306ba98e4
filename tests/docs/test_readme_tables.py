"""The README's tables of real captures say what `check` gives on each (#41: a reviewer ran them verbatim). Every
snapshot a table row names is replayed through the installed CLI and its exit code must be the row's verdict (ok 0,
warn 1, fail 2; a row about an older build gives today's code after "today's code:")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.console import gpudoctor

ROOT = Path(__file__).resolve().parents[2]
WHERE = [ROOT / "examples", ROOT / "tests" / "fixtures" / "snapshots"]
CODES = {"ok": 0, "warn": 1, "fail": 2}


def rows():
    out = []
    for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not line.startswith("|"):
            continue
        snap = next((m for c in cells[:2] for m in re.findall(r"`([\w.-]+\.json)`", c)), None)
        if snap is None:
            continue
        verdict = cells[-1].split("today's code:", 1)[-1]
        word = re.search(r"\b(ok|warn|fail)\b", verdict.replace("*", "").split(";")[0].lower())
        if word:
            out.append(pytest.param(snap, CODES[word.group(1)], id=f"README.md:{n}:{snap}"))
    return out


@pytest.mark.parametrize("snap, code", rows())
def test_a_readme_capture_replays_to_its_verdict(snap, code):
    path = next((d / snap for d in WHERE if (d / snap).is_file()), None)
    assert path is not None, f"{snap} is in neither examples/ nor tests/fixtures/snapshots/"
    r = gpudoctor("check", "--snapshot", str(path), cwd=ROOT)
    assert r.returncode == code, (snap, r.stdout[-800:], r.stderr[-400:])


def test_the_tables_name_captures():
    assert len(rows()) >= 10
