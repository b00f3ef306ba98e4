"""Server logs read like an expert would: the known failures of SGLang 0.5.23 (and PyTorch, NCCL, transformers,
uvicorn under it) named with cause and fix, from real-format excerpts (tests/fixtures/serverlogs/); `gpudoctor sglang
explain LOG`; and campaign records of a server that dies with each signature carry the named cause."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from gpudoctor.bench.server import logscan
from tests.bench.campaigns import write
from tests.bench.conftest import run_cli

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "serverlogs"
SIGNATURES = sorted(p for p in LOGS.glob("*.log") if p.stem not in ("none", "unknown"))
# The causes issue #15 names: each must have a real-format excerpt here.
REQUIRED = {"max-running-zero", "max-running-zero-hybrid", "not-enough-memory", "cuda-oom", "cuda-illegal-instruction",
            "cuda-unknown-error", "nccl-timeout", "nccl-error", "speculative-args-assertion", "speculative-topk-none",
            "draft-context-shorter", "dependency-import-name", "dependency-attribute", "port-in-use",
            "model-path-missing"}


def test_every_required_cause_has_a_real_format_excerpt_and_every_excerpt_a_known_id():
    ids = {k.id for k in logscan.knowledge()}
    assert len(ids) == len(logscan.knowledge()), "duplicate ids in server_failures.yaml"
    assert REQUIRED <= {p.stem for p in SIGNATURES}
    assert {p.stem for p in SIGNATURES} <= ids


@pytest.mark.parametrize("log", SIGNATURES, ids=lambda p: p.stem)
def test_each_excerpt_names_its_cause_with_a_filled_fix(log):
    found = logscan.diagnose(log.read_text())
    assert found is not None and found.id == log.stem, found
    assert found.known and found.cause and found.fix and found.source
    assert not re.search(r"\{\w+\}", found.cause + found.fix), "unfilled placeholder"
    assert logscan.message(found.line).strip()  # the line it blames is in the file, numbered
    assert log.read_text().splitlines()[found.line_no - 1].strip() == found.line


def test_every_knowledge_entry_recognises_its_own_example():
    for k in logscan.knowledge():
        assert k.match.search(logscan.message(k.example)), k.id


def test_placeholders_come_from_the_log():
    found = logscan.diagnose((LOGS / "draft-context-shorter.log").read_text())
    assert "(2048)" in found.cause and "(131072)" in found.cause and "--context-length 2048" in found.fix
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in found.fix
    dep = logscan.diagnose((LOGS / "dependency-import-name.log").read_text())
    assert "nvfp4_pack_quantized" in dep.cause and "pip show compressed-tensors" in dep.fix


def test_priority_root_cause_before_its_consequences():
    # the illegal instruction kills rank 0; the NCCL watchdog lines that follow are its consequence
    text = (LOGS / "cuda-illegal-instruction.log").read_text() + (LOGS / "nccl-timeout.log").read_text()
    assert logscan.diagnose(text).id == "cuda-illegal-instruction"
    # the same max_running_request assert is the hybrid trap only when the log shows a mamba/state cache
    assert logscan.diagnose((LOGS / "max-running-zero.log").read_text()).id == "max-running-zero"


def test_an_allowed_longer_context_is_a_warning_not_a_failure():
    line = ("[2026-02-14 02:07:50] Warning: Target model's context_length (8192) is greater than the derived "
            "context_length (2048). This may lead to incorrect model outputs or CUDA errors.")
    assert logscan.diagnose(line + "\n[2026-02-14 02:07:50] Overriding the draft model's max_position_embeddings "
                            "to 8192.\n") is None


def test_prefixes_of_each_logger_are_stripped():
    for line in ("[2026-11-30 09:00:00 TP3] AssertionError: max_running_request is zero",
                 "Nov 30 09:00:00 gpu1 python3[4242]: AssertionError: max_running_request is zero",
                 "(EngineCore_0 pid=77) ERROR 11-30 09:00:00 [core.py:700] AssertionError: max_running_request is zero"):
        assert logscan.message(line) == "AssertionError: max_running_request is zero", line


@pytest.mark.parametrize("name,code", [("max-running-zero-hybrid", 0), ("unknown", 1), ("none", 0)])
def test_explain_cli_exit_codes_and_output(name, code):
    log = str(LOGS / f"{name}.log")
    p = run_cli("sglang", "explain", log)
    assert p.returncode == code, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    if name == "max-running-zero-hybrid":  # explained: 0 (#41: it was 2, as if explaining had failed)
        assert p.stdout.splitlines()[0] == f"{log}:12: AssertionError: max_running_request is zero"
        assert "cause: " in p.stdout and "fix:   lower --max-running-requests" in p.stdout
        assert "max_mamba_cache_size: 2" in p.stdout  # the lines that matter include the budget line
    elif code == 1:
        assert "not a known failure" in p.stdout and "NotImplementedError: frobnicate" in p.stdout
    else:
        assert "no failure found (4 lines read)" in p.stdout
    j = run_cli("sglang", "explain", "--json", log)
    doc = json.loads(j.stdout)
    assert j.returncode == code and doc["exit_code"] == code and doc["schema"] == "gpudoctor.sglang-explain/1"
    assert (doc["failure"] or {}).get("id") == (None if name == "none" else name)


def test_explain_refuses_what_it_cannot_read_without_waiting(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, tmp_path / "absent.log"):
        t = time.monotonic()
        p = run_cli("sglang", "explain", str(path), timeout=30)
        assert p.returncode == 3 and time.monotonic() - t < 20, (path, p.stderr)
        assert p.stderr.count("\n") == 1 and str(path) in p.stderr and "Traceback" not in p.stderr


def test_a_campaign_whose_server_dies_with_each_signature_records_the_named_cause(tmp_path):
    """One method per signature, each stand-in dying at start with that real log excerpt as its last words."""
    methods = "".join(f"  m{i}: {{args: [--fail-mode, die-at-start, --death-log, '{p}']}}\n"
                      for i, p in enumerate(SIGNATURES))
    path, _ = write(tmp_path, "methods:\n" + methods, concurrency="[1]")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out), timeout=600)
    assert p.returncode == 1, p.stderr
    recs = {r["label"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    for i, sig in enumerate(SIGNATURES):
        r = recs[f"m{i}-tp1"]
        assert r["status"] == "crashed" and r["cause"] == sig.stem, (sig.stem, r["cause"], r["error"])
        assert r["diagnosis"] and r["fix"] and r["output_tok_per_s"] is None
    report = run_cli("bench", "report", str(out))
    assert report.returncode == 0, report.stderr
    md = (out / "report.md").read_text()
    assert "### Causes named from the server logs" in md and "**draft-context-shorter**" in md


def test_a_server_dying_mid_level_records_the_cause_of_its_last_words(tmp_path):
    sig = LOGS / "nccl-timeout.log"
    body = f"methods:\n  tp: {{args: [--fail-mode, die-mid-level, --fail-after-requests, '3', --death-log, '{sig}']}}\n"
    path, _ = write(tmp_path, body, concurrency="[1, 2]")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 1, p.stderr
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    crashed = [r for r in recs if r["status"] == "crashed"]
    assert crashed and crashed[0]["cause"] == "nccl-timeout" and "Watchdog caught" in crashed[0]["log_excerpt"]
    assert all(r["cause"] is None for r in recs if r["status"] == "ok")
