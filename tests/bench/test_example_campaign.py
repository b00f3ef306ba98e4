"""examples/campaign.yaml as the runner uses it: each configuration's gate is asked about the models it serves
(the benchmark profile requires workload.model.*, so a gate without --model could never pass on a healthy host)."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.campaign.file import load
from gpudoctor.campaign.runner import Runner
from gpudoctor.host.local import LocalHost

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "campaign.yaml"


def test_each_configuration_gates_the_models_it_serves(tmp_path):
    camp = load(str(EXAMPLE))
    runner = Runner(camp, str(tmp_path / "out"), host=LocalHost())
    seen = {}
    for cfg in camp.configs():
        argv = runner.gate_argv(cfg)
        assert argv[argv.index("gate"):][:3] == ["gate", "--profile", "benchmark"], argv
        models = [argv[i + 1] for i, a in enumerate(argv) if a == "--model"]
        seen[cfg.label] = models
    assert seen["autoregressive-tp1"] == [camp.model]
    assert seen["eagle3-tp4"] == [camp.model, "/mnt/tmpfs/EAGLE3-LLaMA3.3-Instruct-70B"]
    assert seen["dflash-tp8"] == [camp.model, "/mnt/tmpfs/dflash-llama-70b"]


def test_a_gate_command_naming_its_own_model_is_left_alone(tmp_path):
    text = EXAMPLE.read_text().replace("command: gpudoctor gate --profile benchmark",
                                       "command: gpudoctor gate --profile benchmark --model /elsewhere")
    path = tmp_path / "c.yaml"
    path.write_text(text)
    camp = load(str(path))
    argv = Runner(camp, str(tmp_path / "out"), host=LocalHost()).gate_argv(camp.configs()[0])
    assert [a for a in argv if a.startswith("/")][-1] == "/elsewhere" and argv.count("--model") == 1
