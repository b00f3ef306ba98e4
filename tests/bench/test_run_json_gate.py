"""`bench run --json` when the gate refuses prints its one document (gpudoctor.bench-run/1) with the gate's verdict:
what was refused (the configuration it stopped before) and why — gpudoctor's own gate's `gate --json` document, or a
gate command's argv, exit code and last lines — not only the generic error document (#49)."""

from __future__ import annotations

import json

from tests.bench.campaigns import write
from tests.bench.conftest import run_cli


def _doc(p) -> dict:
    lines = p.stdout.splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stdout + p.stderr  # one document on stdout
    return json.loads(lines[0])


def test_a_gate_command_that_refuses_is_in_the_one_document(tmp_path):
    gate = "[sh, -c, 'echo devices.uvm.open FAIL open /dev/nvidia-uvm EPERM; exit 2']"
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", gate=gate)
    p = run_cli("bench", "run", str(path), "--out", str(tmp_path / "out"), "--json")
    assert p.returncode == 2
    doc = _doc(p)
    assert doc["schema"] == "gpudoctor.bench-run/1" and doc["exit_code"] == 2
    assert doc["counts"] == {"ok": 0, "crashed": 0, "error": 0, "skipped": 0}
    assert doc["stopped"].startswith("gate failed before baseline-tp1, campaign stopped")
    g = doc["gate"]
    assert g["refused"] is True and g["before"] == "baseline-tp1" and "EPERM" in g["said"]
    assert g["verdict"] == {"command": ["sh", "-c", "echo devices.uvm.open FAIL open /dev/nvidia-uvm EPERM; exit 2"],
                            "exit_code": 2, "pass": False, "output": "devices.uvm.open FAIL open /dev/nvidia-uvm EPERM"}


def test_gpudoctors_own_gate_puts_its_gate_json_verdict_in_the_document(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUDOCTOR_INVENTORY", raising=False)
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", gate="[gpudoctor, gate, --profile, benchmark]")
    p = run_cli("bench", "run", str(path), "--out", str(tmp_path / "out"), "--json")
    assert p.returncode == 2  # this machine has no NVIDIA driver: the gate blocks
    doc = _doc(p)
    verdict = doc["gate"]["verdict"]
    assert doc["gate"]["before"] == "baseline-tp1" and doc["exit_code"] == 2
    assert verdict["schema"] == "gpudoctor.gate/1" and verdict["pass"] is False and verdict["profile"] == "benchmark"
    assert verdict["blockers"] and doc["gate"]["said"].startswith("gpudoctor gate, profile benchmark")
    gate = run_cli("gate", "--profile", "benchmark", "--model", str(tmp_path / "model"), "--json")
    assert [b["key"] for b in json.loads(gate.stdout)["blockers"]] == [b["key"] for b in verdict["blockers"]]
