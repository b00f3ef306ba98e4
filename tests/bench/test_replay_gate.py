"""A campaign's gate that replays a snapshot acts on nothing: `bench run` with `gate: [sh, -c, "python -m gpudoctor
gate --snapshot FILE --slurm"]` (an ordinary command, run as written) drains no Slurm node and moves no recovery ladder;
the campaign stops on the snapshot's failure, nothing recorded (docs/security.md "A replay cannot act")."""

from __future__ import annotations

import sys

from tests.bench.campaigns import write
from tests.bench.conftest import REPO, run_cli
from tests.gate.gate_harness import Slurm

BAD = REPO / "tests" / "fixtures" / "snapshots" / "h200-uvm-blocked.json"


def test_a_campaign_gate_replaying_a_snapshot_drains_nothing(tmp_path, monkeypatch):
    slurm = Slurm(tmp_path)
    monkeypatch.setenv("PATH", f"{slurm.bin}:{__import__('os').environ['PATH']}")
    for k, v in slurm.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    monkeypatch.delenv("GPUDOCTOR_INVENTORY", raising=False)
    # through sh: as written (a gpudoctor gate named directly would get the campaign's --model added)
    gate = f"[sh, -c, '{sys.executable} -m gpudoctor gate --snapshot {BAD} --slurm --node gpu01']"
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", gate=gate, concurrency="[1]")
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 2, p.stdout + p.stderr
    assert [c for c in slurm.calls() if c[:1] == ["update"]] == [], p.stderr
    assert "gate failed before baseline-tp1, campaign stopped" in p.stderr
    assert "moves no recovery ladder" in p.stderr and "drained" not in p.stderr
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
    assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text().strip()
