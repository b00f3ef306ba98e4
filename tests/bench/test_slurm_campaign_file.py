"""A campaign's `slurm:` section and the job script gpudoctor writes from it (no Slurm needed: the cluster's tests are
test_slurm_campaign.py)."""

from __future__ import annotations

import sys

import pytest

from gpudoctor.campaign import file as campaign
from gpudoctor.campaign.slurm import job_script
from gpudoctor.cli import main

BASE = """\
name: demo
model: /models/llama
server: {command: /venv/bin/python -m sglang.launch_server}
tp: [1, 4]
methods: {ar: {baseline: true}}
workloads: [{name: chat, max_tokens: [64]}]
concurrency: [1]
gate: {command: false}
"""


def test_job_script_is_plain_and_names_everything(tmp_path, monkeypatch):
    gd = tmp_path / "bin" / "gpudoctor"  # the console script beside the interpreter, as install.sh lays it out
    gd.parent.mkdir()
    gd.write_text("#!/bin/sh\n")
    gd.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(gd.with_name("python3")))
    f = tmp_path / "c.yaml"
    f.write_text(BASE + "slurm:\n  partition: gpu\n  account: perf\n  qos: high\n  time_limit: '1-02:00:00'\n"
                        "  gpu_request: gres\n  sbatch_args: [--constraint=h100, --mem=0]\n")
    c = campaign.load(str(f))
    cfg = c.configs()[1]
    text = job_script(c, cfg, tmp_path / "out", "gpd-demo-1234abcd-ar-tp4", "demo-1234abcd")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/sh"
    sb = [x.split(" ", 1)[1] for x in lines if x.startswith("#SBATCH ")]
    assert sb == ["--job-name=gpd-demo-1234abcd-ar-tp4", "--comment=gpudoctor-campaign=demo-1234abcd",
                  f"--output={tmp_path}/out/slurm/ar-tp4-%j.out", f"--chdir={tmp_path}/out", "--nodes=1",
                  "--ntasks=1", "--no-requeue", "--exclusive", "--gres=gpu:4", "--partition=gpu", "--account=perf",
                  "--qos=high", "--time=1-02:00:00", "--constraint=h100", "--mem=0"]
    assert lines[-1] == f"exec {gd} bench job {f} --out {tmp_path}/out --config ar-tp4"


def test_defaults_ask_gpus_per_tp():
    from gpudoctor.campaign.file import SlurmSpec

    assert SlurmSpec().gpu_request == "gpus" and SlurmSpec().exclusive and SlurmSpec().node_retries == 2


BAD = [
    ("slurm:\n  partition: a b\n", 10, "slurm.partition must be one word"),
    ("slurm:\n  time_limit: soon\n", 10, "slurm.time_limit must be sbatch's --time"),
    ("slurm:\n  gpu_request: cards\n", 10, "slurm.gpu_request must be one of gpus, gres, none"),
    ("slurm:\n  sbatch_args: [--job-name=x]\n", 10, "slurm.sbatch_args: --job-name is set by gpudoctor"),
    ("slurm:\n  sbatch_args: [constraint]\n", 10, "slurm.sbatch_args: 'constraint' must be one option"),
    ("slurm:\n  max_jobs: -1\n", 10, "slurm.max_jobs must be an integer >= 0"),
    ("slurm:\n  exclusive: maybe\n", 10, "slurm.exclusive must be true or false"),
    ("slurm:\n  nodes: 3\n", 10, "unknown key 'nodes' in slurm"),
    ("target: ct200\nslurm: {}\n", 9, "--slurm runs each configuration on the node Slurm gives it: the campaign's "
                                      "target must be local, not ct200"),
]


@pytest.mark.parametrize("extra,line,message", BAD, ids=[b[2][:40] for b in BAD])
def test_bad_slurm_section_is_one_line_exit_3(tmp_path, capsys, monkeypatch, extra, line, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUDOCTOR_INVENTORY", raising=False)
    f = tmp_path / "c.yaml"
    f.write_text(BASE + extra)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "run", str(f), "--out", str(out), "--slurm"])
    assert exc.value.code == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"gpudoctor: {f}:{line}: "), err
    assert message in err, err
    assert not out.exists()


def test_no_submit_needs_slurm(tmp_path, capsys):
    f = tmp_path / "c.yaml"
    f.write_text(BASE)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "run", str(f), "--out", str(tmp_path / "o"), "--no-submit"])
    assert exc.value.code == 3 and "--no-submit goes with --slurm" in capsys.readouterr().err
