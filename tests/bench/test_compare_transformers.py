"""`gpudoctor bench compare` and its gate against a real server: transformers serve 5.17 on CPU (the lab of
tests/bench/transformers_lab.py). Two configurations (--cb-max-batch-tokens 256 vs 512) compared cell by cell; the
gate passes A vs A (the same server measured twice) and fails A vs a really slower configuration (no continuous
batching: at concurrency 4 the requests wait for each other) (#32)."""

from __future__ import annotations

import json

import pytest

from tests.bench.conftest import as_trials, run_cli

GATE = "output_tok_per_s < -15%"  # wide: the lab shares 2 cores with the rest of CI; no CB is ~3x slower here


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from tests.bench import transformers_lab as lab

    venv = lab.venv_for_tests()  # opt-in outside CI (gigabytes), one skip line when it cannot be built
    work = tmp_path_factory.mktemp("tfcompare")
    model, hf_home = work / "tiny-llama", work / "hf"
    lab.build_model(venv, model, hf_home)
    return lab, venv, model, hf_home, work


def measure(server, out, label: str) -> None:
    p = run_cli("bench", "load", "--server-url", server.url, "--api", "completions", "--max-tokens", "12",
                "--concurrency", "4", "--prompts", "16", "--warmup", "1", "--ready-timeout", "300",
                "--label", label, "--tokenizer-dir", str(server.model), "--out", str(out), timeout=600)
    assert p.returncode == 0, p.stderr + server.tail()


def serve(lab, tag: str, **kw):
    mod, venv, model, hf_home, work = lab
    server = mod.Server(venv, model, hf_home, work / f"{tag}.log", **kw)
    why = server.wait_up()
    if why:
        server.stop()
        pytest.fail(why, pytrace=False)
    return server


@pytest.mark.timeout(1500)
def test_two_configurations_compared_and_the_gate(lab, tmp_path):
    for tag, kw in (("b512", {"max_batch_tokens": 512}), ("b256", {"max_batch_tokens": 256}),
                    ("nocb", {"continuous_batching": False})):
        server = serve(lab, tag, **kw)
        try:
            measure(server, tmp_path / tag, "cfg")
            if tag == "b512":  # A and A again as 2 trials each: the A/A gate is Welch's on trial values (below)
                for n in range(1, 4):
                    measure(server, tmp_path / f"b512-{n}", "cfg")
        finally:
            server.stop()
    rec = json.loads((tmp_path / "b512" / "results.jsonl").read_text().splitlines()[0])
    assert rec["status"] == "ok" and rec["schema"] == "gpudoctor.bench/3"
    assert len(rec["per_request"]["rows"]) == 16 and rec["steady"]["status"] in ("steady", "too_short")
    assert rec["provenance"]["server"]["engine"] == "unknown"  # transformers serve has no /server_info or /version
    assert rec["server_counters"]["status"] == "unavailable"  # nor /metrics

    p = run_cli("bench", "compare", str(tmp_path / "b512"), str(tmp_path / "b256"), "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout)
    (cell,) = res["cells"]
    t = cell["metrics"]["output_tok_per_s"]
    assert "bootstrap" in t["test"] and t["lo"] <= t["diff"] <= t["hi"]
    assert cell["verdict"] in ("faster", "slower", "no difference detectable")

    # A vs A: two trials a side, so the test sees run-to-run variation (one trial a side on this loaded machine once
    # differed by -28.7 % with p=0.0007 from the per-request values alone: docs/bench.md, trials are the evidence)
    as_trials(tmp_path / "aa1", tmp_path / "b512", tmp_path / "b512-1")
    as_trials(tmp_path / "aa2", tmp_path / "b512-2", tmp_path / "b512-3")
    same = run_cli("bench", "compare", str(tmp_path / "aa1"), str(tmp_path / "aa2"), "--fail-if", GATE)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "gate: pass" in same.stdout and "Welch t on trial values" in same.stdout
    worse = run_cli("bench", "compare", str(tmp_path / "b512"), str(tmp_path / "nocb"), "--fail-if", GATE)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "GATE FAIL" in worse.stdout and "SLOWER" in worse.stdout
