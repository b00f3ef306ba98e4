"""`bench run --resume` continues only the campaign its --out holds (#50.1): another campaign's file — even one with
the same name, or the same file edited since — is refused in one line, exit 3, with nothing written (results.jsonl,
campaign.yaml and campaign.json stay byte for byte) and no server started. The Slurm side: test_slurm_campaign.py."""

from __future__ import annotations

import os

from tests.bench.campaigns import write
from tests.bench.conftest import run_cli

ONE = "methods:\n  baseline: {baseline: true}\n"
OTHER = "methods:\n  baseline: {baseline: true}\n  eagle3: {args: [--accept-length, '3']}\n"


def tree(d):
    """Every file under d: its bytes and mtime (a replaced file changes either)."""
    out = {}
    for root, _dirs, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = (open(p, "rb").read(), os.stat(p).st_mtime_ns)
    return out


def test_resume_with_another_campaign_of_the_same_name_is_refused_and_writes_nothing(tmp_path):
    first, _ = write(tmp_path, ONE, concurrency="[1]")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(first), "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    before = tree(out)
    assert "results.jsonl" in before and "campaign.yaml" in before
    other, _ = write(tmp_path, OTHER, concurrency="[1]", name="other.yaml")  # `name: test` too
    p = run_cli("bench", "run", str(other), "--out", str(out), "--resume")
    assert p.returncode == 3, p.stderr[-2000:]
    err = p.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(f"gpudoctor: {out}: holds another campaign") and str(other) in err, err
    assert tree(out) == before  # nothing written, nothing replaced, no server started (no log)


def test_resume_after_the_file_was_edited_is_refused_and_the_same_file_resumes(tmp_path):
    path, _ = write(tmp_path, ONE, concurrency="[1]")
    out = tmp_path / "out"
    assert run_cli("bench", "run", str(path), "--out", str(out)).returncode == 0
    before = tree(out)
    text = path.read_text()
    path.write_text(text.replace("max_tokens: [24]", "max_tokens: [32]"))
    p = run_cli("bench", "run", str(path), "--out", str(out), "--resume")
    assert p.returncode == 3 and "holds another campaign" in p.stderr, p.stderr[-2000:]
    assert tree(out) == before
    path.write_text(text)  # the campaign the directory holds: resumed (nothing left to run)
    p = run_cli("bench", "run", str(path), "--out", str(out), "--resume")
    assert p.returncode == 0, p.stderr[-2000:]
    assert (out / "results.jsonl").read_bytes() == before["results.jsonl"][0]
