"""Our rules against SGLang 0.5.23's own verdicts, cached by tools/sglang_differential.py.

SGLang itself is not needed here: differential_cache.json holds what its parser, resolve_once, check_server_args
and the draft worker's ModelConfig said for every case of corpus.yaml and differential.yaml (run with faked H200 /
RTX PRO 6000 device queries). Each case's digest ties the cached verdict to the exact args, env, GPU and configs:
change a case and this test fails until the differential is re-run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.errors import InputError
from gpudoctor.sglang import differential as D
from gpudoctor.sglang.resolver import judge

HERE = Path(__file__).parent
MODELS, CASES = D.load(HERE)
CACHE = json.loads((HERE / "differential_cache.json").read_text())
ALLOWED_FALSE_REJECTS = 2  # issue #18, acceptance 1


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    return D.write_models(MODELS, tmp_path_factory.mktemp("diffmodels"))


@pytest.fixture(scope="module")
def verdicts(dirs):
    out = {}
    for c in CASES:
        ours = D.run_ours(c, dirs)
        real = CACHE["cases"].get(c["name"])
        if isinstance(ours, InputError) or real is None or not D.comparable(c):
            out[c["name"]] = ("n/a", [])
        else:
            out[c["name"]] = judge(ours, real, D.skipped_values(c))
    return out


def test_cache_covers_every_case_and_is_current():
    stale = [c["name"] for c in CASES
             if c["name"] not in CACHE["cases"] or CACHE["cases"][c["name"]]["key"] != D.case_key(c, MODELS)]
    assert not stale, f"re-run tools/sglang_differential.py: cached verdicts missing or stale for {stale}"
    assert CACHE["sglang_version"] == "0.5.23"
    assert len(CASES) >= 150


def test_no_reference_environment_failures_in_cache():
    broken = [n for n, r in CACHE["cases"].items() if r.get("error_type") in ("ModuleNotFoundError", "ImportError")
              or r.get("ok") is None]
    assert not broken, f"the reference venv lacked a module for {broken}"


def test_zero_false_accepts(verdicts):
    bad = {n: d for n, (k, d) in verdicts.items() if k in ("false_accept", "stage")}
    assert not bad, bad


def test_false_rejects_bounded_and_explained(verdicts):
    fr = [n for n, (k, _) in verdicts.items() if k == "false_reject"]
    assert len(fr) <= ALLOWED_FALSE_REJECTS, fr
    known = {c["name"]: c.get("known", {}) for c in CASES}
    for n in fr:
        assert known[n].get("kind") == "false_reject" and known[n].get("why"), f"{n}: unexplained false reject"


def test_resolved_values_agree(verdicts):
    """steps/topk/draft tokens, max_running_requests, mem_fraction_static, chunked prefill, page size, context."""
    known = {c["name"]: c.get("known", {}) for c in CASES}
    bad = {n: d for n, (k, d) in verdicts.items() if k == "values" and known[n].get("kind") != "values"}
    assert not bad, bad


def test_the_differential_judges_both_ways(verdicts):
    """The corpus is not one-sided: SGLang rejects a good share of it, at every stage we reproduce."""
    stages = {r.get("stage") for r in CACHE["cases"].values() if r.get("ok") is False}
    assert {"parse", "resolve", "check", "draft"} <= stages
    rejected = sum(1 for r in CACHE["cases"].values() if r.get("ok") is False)
    assert 40 <= rejected <= len(CACHE["cases"]) - 40


def _cli(args: list[str], env_extra: dict | None = None):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "gpudoctor", "sglang", "validate", *args], capture_output=True,
                          text=True, timeout=60, env=env)


SEED_FLAGS = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "1", "--speculative-num-draft-tokens", "3",
              "--speculative-eagle-topk", "1", "--tp", "8"]


def test_seed_eagle3_flags_with_a_2048_context_draft_are_invalid_with_both_fixes(dirs):
    """Acceptance 2: the seed's working EAGLE3 set + a 2048-context draft fails after the load in SGLang."""
    cp = _cli(["--gpu", "h200", "--", "--model-path", dirs["llama31_8b"], "--speculative-draft-model-path",
               dirs["eagle3_draft_2k"], *SEED_FLAGS])
    assert cp.returncode == 2, cp.stdout + cp.stderr
    out = cp.stdout
    assert "FAIL sglang.spec.draft_context: the draft's derived context 2048 is shorter than the target's 131072" in out
    assert ("SGLang says: ValueError: Warning: Target model's context_length (131072) is greater than the derived "
            "context_length (2048).") in out
    assert "fix: pass --context-length 2048 (the draft's limit), or set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in out
    assert "(stage: draft)" in out
    # --context-length 30000 still exceeds the draft: the same failure at 30000 vs 2048, the fix names the lower bound
    cp = _cli(["--json", "--", "--model-path", dirs["llama31_8b"], "--speculative-draft-model-path",
               dirs["eagle3_draft_2k"], *SEED_FLAGS, "--context-length", "30000"])
    f = {x["id"]: x for x in json.loads(cp.stdout)["findings"]}["sglang.spec.draft_context"]
    assert f["status"] == "fail" and (f["data"]["target_context"], f["data"]["draft_context"]) == (30000, 2048)
    assert "lower --context-length to 2048" in f["hint"]
    # either fix makes the launch valid as far as the draft is concerned
    cp = _cli(["--json", "--", "--model-path", dirs["llama31_8b"], "--speculative-draft-model-path",
               dirs["eagle3_draft_2k"], *SEED_FLAGS, "--context-length", "2048"])
    assert "sglang.spec.draft_context" not in [x["id"] for x in json.loads(cp.stdout)["findings"]]
    cp = _cli(["--json", "--", "--model-path", dirs["llama31_8b"], "--speculative-draft-model-path",
               dirs["eagle3_draft_2k"], *SEED_FLAGS], {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"})
    f = {x["id"]: x for x in json.loads(cp.stdout)["findings"]}["sglang.spec.draft_context"]
    assert f["status"] == "warn" and cp.returncode == 1
    # and SGLang itself said the same for these cases (cached verdicts)
    cases = CACHE["cases"]
    assert cases["seed_eagle3_draft_2k_fails_after_load"]["stage"] == "draft"
    assert "Target model's context_length (131072) is greater than the derived context_length (2048)" in \
        cases["seed_eagle3_draft_2k_fails_after_load"]["error"]
    assert "(30000) is greater than the derived context_length (2048)" in cases["seed_eagle3_draft_2k_ctx30000_still_fails"]["error"]
    assert cases["seed_eagle3_draft_2k_ctx2048_fits"]["ok"] and cases["seed_eagle3_draft_2k_env_allows"]["ok"]


@pytest.mark.parametrize("case", [c for c in CASES if c.get("expect")], ids=lambda c: c["name"])
def test_expected_findings(case, dirs):
    """The rule each case is about fires with the status the case names (not only the verdict SGLang agrees with)."""
    ours = D.run_ours(case, dirs)
    got = {}
    for f in ours.findings:
        got.setdefault(f.id, set()).add(f.status.value)
        assert f.data.get("source"), f.id
        if f.status.value in ("fail", "warn"):
            assert f.hint, f"{f.id} has no fix"
    for fid, status in case["expect"].items():
        assert status in got.get(fid, set()), f"{fid}: want {status}, got {sorted(got)}"
