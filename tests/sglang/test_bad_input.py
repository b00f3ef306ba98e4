"""Bad input to `gpudoctor sglang validate` -> exactly one line naming file (and line), exit 3, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def run(args, cwd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    return subprocess.run([sys.executable, "-m", "gpudoctor", "sglang", "validate", *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


GOOD = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 131072}

TRAILING_COMMA = '{\n  "num_attention_heads": 32,\n  "num_hidden_layers": 32,\n}\n'


def parser_line(text: str) -> int:
    """The line this Python's json parser stops at: 3.11-3.12 blame the `}` after a trailing comma (line 4), 3.13
    the comma itself (line 3, "Illegal trailing comma"). gpudoctor reports the parser's line, whichever Python."""
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        assert e.lineno in (3, 4), e  # the comma's line or the brace's: anything else would be a parser we never met
        return e.lineno
    raise AssertionError("the text parses")


# name -> (files to write {relative path: text}, validate options, args after --, expected line pattern)
BAD = {
    "trailing_comma": ({"m/config.json": TRAILING_COMMA}, ["--model-config", "{d}/m"], ["--model-path", "x"],
                       f"{{d}}/m/config.json:{parser_line(TRAILING_COMMA)}: invalid JSON"),
    "missing_file": ({}, ["--model-config", "{d}/nope/config.json"], ["--model-path", "x"],
                     "{d}/nope/config.json: no such model config"),
    "not_an_object": ({"m/config.json": "[1, 2]\n"}, ["--model-config", "{d}/m/config.json"], ["--model-path", "x"],
                      "{d}/m/config.json:1: expected a JSON object, found list"),
    "heads_as_string": ({"m/config.json": '{\n  "architectures": ["LlamaForCausalLM"],\n  "num_attention_heads": "32"\n}\n'},
                        ["--model-config", "{d}/m"], ["--model-path", "x"],
                        "{d}/m/config.json:3: num_attention_heads must be an integer >= 1, found '32'"),
    "broken_safetensors_index": ({"m/config.json": json.dumps(GOOD),
                                  "m/model.safetensors.index.json": '{"metadata": {"total_size": 16}\n "weight_map": {}}'},
                                 ["--model-config", "{d}/m"], ["--model-path", "x"],
                                 "{d}/m/model.safetensors.index.json:2: invalid JSON"),
    "bad_draft_config": ({"m/config.json": json.dumps(GOOD), "dr/config.json": "{oops"},
                         ["--model-config", "{d}/m", "--draft-config", "{d}/dr"],
                         ["--model-path", "x", "--speculative-algorithm", "EAGLE3"], "{d}/dr/config.json:1: invalid JSON"),
    "local_model_path_broken": ({"m/config.json": "{\n\n  nope\n}"}, [], ["--model-path", "{d}/m"],
                                "{d}/m/config.json:3: invalid JSON"),
    "no_args": ({}, [], [], "no SGLang arguments"),
    "unknown_sglang_version": ({}, ["--sglang-version", "0.4.0"], ["--model-path", "x"], "no flag table for SGLang 0.4.0"),
    "unknown_gpu": ({}, ["--gpu", "h300"], ["--model-path", "x"], "unknown --gpu 'h300' (known: a100_80g, b200, h100"),
    "quant_config_not_an_object_is_ignored_but_heads_bad": (
        {"m/config.json": '{\n  "quantization_config": "fp8",\n  "num_hidden_layers": -2\n}\n'},
        ["--model-config", "{d}/m"], ["--model-path", "x"],
        "{d}/m/config.json:3: num_hidden_layers must be an integer >= 1, found -2"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_one_line_exit_3(name, tmp_path):
    files, opts, args, expect = BAD[name]
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    sub = lambda s: s.replace("{d}", str(tmp_path))  # noqa: E731
    cp = run([sub(o) for o in opts] + (["--"] + [sub(a) for a in args] if args else []))
    assert cp.returncode == 3, cp.stdout + cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1, cp.stderr
    assert "Traceback" not in cp.stderr and cp.stdout == ""
    assert lines[0].startswith("gpudoctor: ")
    assert sub(expect) in lines[0], lines[0]


@pytest.mark.parametrize("opts,expect", [
    (["--gpu-mem-gib", "lots"], "Invalid value for '--gpu-mem-gib': 'lots' is not a valid"),
    (["--gpu-mem-gib", "nan"], "Invalid value for '--gpu-mem-gib': 'nan' is not a finite number"),
    (["--input-len=-5"], "Invalid value for '--input-len': -5 is not in the range 0<=x<=2147483647"),
    (["--output-len", "3x"], "Invalid value for '--output-len': '3x' is not an integer (32768, 32k, 25.6k, 32Ki)"),
])
def test_bad_own_option_is_a_usage_error_naming_it(opts, expect):
    cp = run(opts + ["--", "--model-path", "x"])
    assert cp.returncode == 3 and cp.stdout == "", cp.stdout + cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in cp.stderr
    assert lines[0].startswith("gpudoctor sglang validate: Error: ") and expect in lines[0], lines[0]
