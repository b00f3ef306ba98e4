"""The verdict corpus (corpus.yaml) through the real CLI: verdict, exit code, finding ids, resolved values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CORPUS = yaml.safe_load((Path(__file__).parent / "corpus.yaml").read_text())


def write_models(root: Path) -> dict[str, Path]:
    dirs = {}
    for name, cfg in CORPUS["models"].items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
        dirs[name] = d
    return dirs


def run_cli(args: list[str], env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "gpudoctor", "sglang", "validate", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def case_argv(case: dict, dirs: dict[str, Path]) -> list[str]:
    sub = {"{model}": str(dirs[case["model"]]) if case.get("model") else "",
           "{draft}": str(dirs[case["draft"]]) if case.get("draft") else ""}
    opts = ["--json"]
    if case.get("model"):
        opts += ["--model-config", str(dirs[case["model"]])]
    if case.get("draft"):
        opts += ["--draft-config", str(dirs[case["draft"]])]
    own = [str(x) for x in case.get("options", [])]
    if not {"--gpu", "--gpu-mem-gib"} & set(own):
        opts += [str(x) for x in CORPUS["gpu_options"]]
    opts += own
    args = [sub.get(str(a), str(a)) for a in case["args"]]
    return opts + ["--"] + args


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return write_models(tmp_path_factory.mktemp("models"))


@pytest.mark.parametrize("case", CORPUS["cases"], ids=[c["name"] for c in CORPUS["cases"]])
def test_corpus_case(case, model_dirs):
    cp = run_cli(case_argv(case, model_dirs), case.get("env"))
    assert cp.returncode == case["exit"], cp.stdout + cp.stderr
    out = json.loads(cp.stdout)
    assert out["verdict"] == case["verdict"]
    assert out["exit_code"] == case["exit"]
    got = {}
    for f in out["findings"]:
        got.setdefault(f["id"], set()).add(f["status"])
        assert f["data"]["source"], f  # every finding names the rule's source
        if f["status"] in ("fail", "warn"):
            assert f["hint"], f"{f['id']} has no fix"
    for fid, status in (case.get("ids") or {}).items():
        assert fid in got, f"{fid} missing; got {sorted(got)}"
        assert status in got[fid], f"{fid}: want {status}, got {got[fid]}"
    for fid in case.get("absent", []):
        assert fid not in got, f"{fid} should not be reported"
    if case["verdict"] == "valid":
        assert not any(s & {"fail", "warn"} for s in got.values()), got
    for k, v in (case.get("resolved") or {}).items():
        assert out["resolved"].get(k) == v, f"resolved {k}: {out['resolved'].get(k)!r} != {v!r}"


def test_human_output_names_error_fix_and_source(model_dirs):
    d = str(model_dirs["llama31_8b"])
    cp = run_cli(["--", "--model-path", d, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", d,
                  "--speculative-num-steps", "1", "--speculative-num-draft-tokens", "3"])
    assert cp.returncode == 2
    assert "FAIL sglang.spec.steps_without_topk" in cp.stdout
    assert "TypeError: '>' not supported between instances of 'NoneType' and 'int'" in cp.stdout
    assert "fix: add --speculative-eagle-topk 1" in cp.stdout
    assert "speculative_hook.py::_handle_eagle_family" in cp.stdout
    assert cp.stdout.rstrip().endswith("verdict: invalid (exit 2)")


def test_model_config_read_from_local_model_path(model_dirs):
    """Without --model-config, a local --model-path directory's config.json is read."""
    cp = run_cli(["--json", "--", "--model-path", str(model_dirs["qwen25_7b"]), "--tp-size", "8"])
    out = json.loads(cp.stdout)
    assert cp.returncode == 2
    assert "sglang.tp.attention_heads" in [f["id"] for f in out["findings"]]
