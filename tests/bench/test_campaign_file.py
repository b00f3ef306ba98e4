"""Campaign files: a corpus of bad inputs through the real CLI (one line FILE:LINE, exit 3), and the expansion."""

from __future__ import annotations

import pytest

from gpudoctor.campaign import file as campaign
from gpudoctor.cli import main

GOOD = """\
name: demo
model: /models/llama
server:
  command: /venv/bin/python -m sglang.launch_server
  port: 30001
  args: --mem-fraction-static 0.85 --attention-backend fa3
  env: {SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: 1}
nccl_env:
  4: {NCCL_P2P_LEVEL: NVL}
tp: [1, 4]
methods:
  eagle3:
    draft_model: /models/eagle3
    args: [--speculative-algorithm, EAGLE3, --speculative-num-steps, 1]
    tp: [4]
  ar: {baseline: true}
workloads:
  - name: chat
    max_tokens: [256, 1024]
    context_lengths: [null, 3000]
    trials: 2
concurrency: [16, 1, 4]
gate:
  command: false
"""


def test_good_campaign_expands(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(GOOD)
    c = campaign.load(str(f))
    assert c.baseline == "ar" and c.concurrency == [1, 4, 16] and c.gate_command is None
    assert c.validate is True  # the server command is SGLang's launcher
    cfgs = c.configs()
    assert [x.label for x in cfgs] == ["ar-tp1", "ar-tp4", "eagle3-tp4"]
    e = cfgs[2]
    assert e.argv == ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/llama", "--tp-size",
                      "4", "--host", "127.0.0.1", "--port", "30001", "--mem-fraction-static", "0.85",
                      "--attention-backend", "fa3", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps",
                      "1", "--speculative-draft-model-path", "/models/eagle3"]
    assert e.env == {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1", "NCCL_P2P_LEVEL": "NVL"}
    assert cfgs[0].env == {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
    assert c.workloads[0].context_lengths == [None, 3000] and c.workloads[0].trials == 2
    assert c.gate_command is None


def test_defaults(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model: /m\ntp: 8\nmethods: {baseline: {}}\nworkloads: [{name: w, max_tokens: 64}]\n"
                 "concurrency: 1\n")
    c = campaign.load(str(f))
    assert c.server_command == ["python3", "-m", "sglang.launch_server"]  # no bare python (#23)
    assert c.gate_command == ["gpudoctor", "gate", "--profile", "benchmark"]
    assert c.gate_call == campaign.GateCall(profile="benchmark")  # gpudoctor's own gate: judged in process
    assert c.baseline == "baseline" and c.port == 30000 and c.timeouts["ready_s"] == 1800
    assert c.configs()[0].sglang_args == ["--model-path", "/m", "--tp-size", "8", "--host", "127.0.0.1", "--port",
                                          "30000"]


MINIMAL = "model: /m\ntp: 8\nmethods: {baseline: {}}\nworkloads: [{name: w, max_tokens: 64}]\nconcurrency: 1\n"


@pytest.mark.parametrize("command, call", [
    ("gpudoctor gate", campaign.GateCall()),
    ("gpudoctor gate --profile=serve --model /a --model /b --expect-gpus 8 --timeout 2.5 --host ct200 "
     "--inventory /etc/inv.yaml --sglang-url http://127.0.0.1:30000",
     campaign.GateCall("serve", ("/a", "/b"), 8, "http://127.0.0.1:30000", 2.5, "ct200", "/etc/inv.yaml")),
    ("/usr/bin/python3 -m gpudoctor gate --profile benchmark", campaign.GateCall("benchmark")),
    ("gpudoctor gate --json", None),  # a flag the in-process gate does not carry: run as written
    ("/opt/gd/bin/gpudoctor gate", None),  # a path: the user's own gpudoctor
    ("gpudoctor check", None),
    ("sh -c 'gpudoctor gate'", None),
])
def test_gate_command_judged_in_process(tmp_path, command, call):
    f = tmp_path / "c.yaml"
    f.write_text(MINIMAL + f"gate:\n  command: {command}\n")
    c = campaign.load(str(f))
    assert c.gate_call == call and c.gate_command == __import__("shlex").split(command)


# (file body, line, message) — every one must exit 3 with `gpudoctor: FILE:LINE: message`
BAD = [
    ("model: /m\ntp: [1]\nmethods: {a: {}}\nworkloads: [{name: w, max_tokens: 8}]\n", 1,
     "missing required key 'concurrency'"),
    (GOOD.replace("concurrency: [16, 1, 4]", "concurency: [16, 1, 4]"), 22, "unknown key 'concurency'"),
    (GOOD.replace("tp: [1, 4]", "tp: [1, four]"), 10, "tp.1 must be an integer >= 1, got 'four'"),
    (GOOD.replace("tp: [1, 4]", "tp: [0]"), 10, "tp.0 must be an integer >= 1, got 0"),
    (GOOD.replace("tp: [1, 4]", "tp: [1, 1]"), 10, "tp has duplicates"),
    (GOOD.replace("    tp: [4]", "    tp: [8]"), 15, "methods.eagle3.tp: 8 is not in the campaign's tp list [1, 4]"),
    (GOOD.replace("  ar: {baseline: true}", "  ar: {baseline: yes please}"), 16,
     "methods.ar.baseline must be true or false"),
    (GOOD.replace("  ar: {baseline: true}", "  ar: {baseline: true}\n  b2: {baseline: true}"), 11,
     "only one method can be the baseline"),
    (GOOD.replace("  ar: {baseline: true}", "  a r: {}"), 16, "method name 'a r' must be letters"),
    (GOOD.replace("  port: 30001", "  port: 70000"), 5, "server.port must be an integer >= 1 and <= 65535"),
    (GOOD.replace("  4: {NCCL_P2P_LEVEL: NVL}", "  8: {NCCL_P2P_LEVEL: NVL}"), 9,
     "nccl_env key 8 must be one of the tp sizes [1, 4]"),
    (GOOD.replace("  4: {NCCL_P2P_LEVEL: NVL}", "  4: {NCCL P2P: NVL}"), 9, "is not an environment variable name"),
    (GOOD.replace("    max_tokens: [256, 1024]\n", ""), 18, "workload 'chat' needs max_tokens"),
    (GOOD.replace("    max_tokens: [256, 1024]", "    max_tokens: [256, -1]"), 19,
     "workloads.0.max_tokens.1 must be an integer >= 1"),
    (GOOD.replace("    context_lengths: [null, 3000]", "    context_lengths: [null, 3k]"), 20,
     "workloads.0.context_lengths.1 must be an integer >= 1 and <= 2097152, got '3k'"),
    (GOOD.replace("  - name: chat", "  - name: chat\n    prompts: missing.jsonl"), 19,
     "prompt set 'missing.jsonl' not found"),
    (GOOD.replace("  - name: chat", "  - name: chat\n    prmpts: x"), 19, "unknown key 'prmpts' in workloads.0"),
    (GOOD + "timeouts: {ready_s: -5}\n", 25, "timeouts.ready_s must be a number >= 0.001"),
    (GOOD + "timeouts: {ready: 5}\n", 25, "unknown key 'ready' in timeouts"),
    (GOOD + "on_crash: retry\n", 25, "on_crash must be skip or restart"),
    (GOOD + "validate: sometimes\n", 25, "validate must be auto, true or false"),
    (GOOD + "target: ct 200\n", 25, "target 'ct 200' must be local or the name of an inventory host"),
    (GOOD + "target: [ct200]\n", 25, "target must be a non-empty string"),
    (GOOD.replace("  port: 30001", "  port: 30001\n  remote_dir: ''"), 6, "server.remote_dir must be a non-empty string"),
    (GOOD.replace("  args: --mem-fraction-static 0.85 --attention-backend fa3", "  args: \"--x 'unclosed\""), 6,
     "server.args: cannot split into arguments"),
    (GOOD.replace("  command: /venv/bin/python -m sglang.launch_server", "  command: {a: 1}"), 4,
     "server.command must be a string or a list of strings"),
    (GOOD + "tp: [2]\n", 25, "duplicate key 'tp'"),
    (MINIMAL + "gate:\n  command: gpudoctor gate --timeout soon\n", 7,
     "gate.command: --timeout must be a number, got 'soon'"),
    (MINIMAL + "gate:\n  command: gpudoctor gate --timeout 9000\n", 7,
     "gate.command --timeout must be a number >= 0.1 and <= 600, got 9000"),
    (MINIMAL + "gate:\n  command: gpudoctor gate --expect-gpus -1\n", 7,
     "gate.command --expect-gpus must be an integer >= 0, got -1"),
    (MINIMAL + "gate:\n  command: gpudoctor gate --profile\n", 7, "gate.command: --profile needs a value"),
    (MINIMAL + "gate:\n  command: gpudoctor gate --profile nope\n", 7,
     "gate.command: unknown gate profile 'nope' (known: benchmark, default, serve)"),
    (MINIMAL + "gate:\n  command: gpudoctor gate --sglang-url ftp://x\n", 7,
     "gate.command --sglang-url must be an http:// or https:// URL"),
    ("model: [unclosed\n", 1, "YAML syntax error"),  # where the bracket opened, not the end of the file
    ("- just\n- a list\n", 1, "the campaign must be a mapping"),
    ("", 1, "the campaign must be a mapping"),
]


@pytest.mark.parametrize("body,line,message", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_campaign_is_one_line_exit_3(tmp_path, capsys, monkeypatch, body, line, message):
    monkeypatch.chdir(tmp_path)  # no ./inventory.yaml: the gate's profiles are the built-in ones
    monkeypatch.delenv("GPUDOCTOR_INVENTORY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    f = tmp_path / "c.yaml"
    f.write_text(body)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "run", str(f), "--out", str(out)])
    assert exc.value.code == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"gpudoctor: {f}:{line}: "), err
    assert message in err, err
    assert not out.exists()  # nothing half-written


def test_missing_file_is_exit_3(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "run", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")])
    assert exc.value.code == 3
    assert "no such campaign" in capsys.readouterr().err


def test_example_campaign_is_valid():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "campaign.yaml"
    c = campaign.load(str(example))
    labels = [x.label for x in c.configs()]
    assert c.baseline == "autoregressive" and labels[0] == "autoregressive-tp1"
    assert "dflash-tp4" in labels and "dflash-tp1" not in labels and "eagle3-tp8" in labels


@pytest.mark.parametrize("gate", ["gate: false", "gate: {command: false}"])
def test_gate_false_disables_the_gate(tmp_path, gate):
    """#41: `gate: false` was read as an empty mapping and the default gate ran; it means no gate, as
    `gate: {command: false}` does."""
    f = tmp_path / "c.yaml"
    f.write_text(MINIMAL + gate + "\n")
    c = campaign.load(str(f))
    assert c.gate_command is None and c.gate_call is None


def test_gate_true_is_one_line(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text(MINIMAL + "gate: true\n")
    with pytest.raises(SystemExit) as e:
        main(["bench", "run", str(f), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 3 and "gate must be a mapping (command, heal_command) or false, got True" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
