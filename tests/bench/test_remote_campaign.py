"""`gpudoctor bench run` with `target: ct200`: servers started over real SSH, load sent from here, measured truth.

ct200 is the test sshd on 127.0.0.1 (tests/bench/remote_lab.py); the stand-in server is the "remote" SGLang.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.bench.timing import Slack
from tests.model.modelfiles import write_model

from tests.bench.conftest import REPO, env, run_cli
from tests.bench.remote_lab import make_lab
from tests.bench.test_campaign_run import assert_honest, by_key, records


@pytest.fixture
def lab(tmp_path, sshd, monkeypatch):
    lab = make_lab(tmp_path, sshd)
    for k, v in lab.roots.items():
        monkeypatch.setenv(k, v)  # the CLI runs (python -m tests.rooted) see ct200 rooted under lab.files
    yield lab
    assert lab.kill_leftovers() == [], "a server was left running on the target"


def bench_run(lab, campaign, out, *extra, timeout=60):
    return run_cli("bench", "run", str(campaign), "--out", str(out), "--inventory", str(lab.inventory), *extra,
                   timeout=timeout)


def expected_tok_s(prompts: int, conc: int, max_tokens: int, e2e_s: float) -> float:
    return prompts * max_tokens / (math.ceil(prompts / conc) * e2e_s)


def test_full_campaign_over_ssh_measures_the_known_truth(lab):
    # 200 tok/s after a 20 ms first token, 40 tokens: baseline e2e = 20 + 39 x 5 = 215 ms, ITL 5 ms;
    # eagle3 carries 4 tokens per step: e2e = 20 + 36 x 5 = 200 ms, per-token ITL 5 ms, accept length exactly 4.
    body = """\
    methods:
      baseline: {baseline: true}
      eagle3:
        args: [--speculative-algorithm, EAGLE3, --accept-length, "4"]
        draft_model: /models/draft
    """
    lab.smi_busy.write_text("2")  # the first stop finds GPU memory still held for two more queries
    path, port = lab.campaign(body, max_tokens=40, decode="200", ttft="20")
    out = lab.tmp / "out"
    with Slack().during() as slack:  # the lateness around and during the run (timing.py)
        p = bench_run(lab, path, out)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[-1] == f"inventory: {lab.inventory}"  # the file that named the target (#23)
    recs = records(out)
    assert_honest(recs)
    assert sorted((r["label"], r["concurrency"]) for r in recs) == [
        ("baseline-tp1", 1), ("baseline-tp1", 2), ("eagle3-tp1", 1), ("eagle3-tp1", 2)]
    for r in recs:
        e2e = 215.0 if r["method"] == "baseline" else 200.0
        assert r["status"] == "ok" and r["completed"] == r["requests"] == 4 and r["output_tokens"] == 160
        assert r["e2e_ms_p50"] == pytest.approx(e2e, abs=e2e * 0.03 + 2 * slack.p90_ms), (r, slack)
        assert 20.0 <= r["ttft_ms_p50"] < 35.0 + 2 * slack.p90_ms, (r, slack)
        assert r["itl_ms_p50"] == pytest.approx(5.0, abs=0.3 + slack.p50_ms), (r, slack)
        assert r["output_tok_per_s"] == pytest.approx(expected_tok_s(4, r["concurrency"], 40, e2e / 1000),
                                                      rel=0.04 + slack.wall_ms / e2e), (r, slack)
        assert r["accept_length"] == (pytest.approx(4.0, abs=1e-9) if r["method"] == "eagle3" else None)
        # its GPUs were sampled on ct200 (health.py started there through the Host seam); no driver in the lab
        assert r["host_health"]["host"] == "ct200" and r["host_health"]["status"] == "unavailable", r["host_health"]
        assert r["host_health"]["reason"].startswith("NVML unavailable: "), r["host_health"]

    # The gate ran here, aimed at ct200 through the same inventory, once per configuration, with the models that
    # configuration serves (the benchmark profile requires workload.model.*).
    gate = ["gate", "--profile", "benchmark", "--host", "ct200", "--inventory", str(lab.inventory),
            "--model", f"{lab.tmp}/model"]
    assert lab.gate_calls() == [gate, gate + ["--model", "/models/draft"]]
    # GPU release was asked on ct200 (its PATH) after each stop, and the campaign waited out the busy answers.
    calls = lab.smi_calls()
    assert calls.count("--query-compute-apps=pid,used_memory --format=csv,noheader,nounits") == 4
    assert lab.smi_busy.read_text().strip() == "0"
    # The servers ran on the target: their logs there, mirrored here byte for byte.
    remote = lab.remote_logs()
    assert set(remote) == {"baseline-tp1.log", "eagle3-tp1.log"}
    for name, data in remote.items():
        assert (out / "logs" / name).read_bytes() == data
    log = remote["eagle3-tp1.log"].decode()
    assert "--speculative-draft-model-path /models/draft" in log and "--host 127.0.0.1" in log
    assert "The server is fired up and ready to roll!" in log
    assert "=== gpudoctor: starting at" in log
    meta = json.loads((out / "campaign.json").read_text())
    assert meta["target"] == "ct200" and meta["server_url"] == f"http://127.0.0.1:{port}"
    assert meta["remote_dir"].startswith(str(lab.remote_dir) + "/remote_test-")
    assert "servers run on ct200" in p.stderr and "starting on ct200:" in p.stderr
    assert not (out / "server.pid").exists()


def test_remote_server_that_dies_is_recorded_with_its_remote_log(lab):
    # warm-up 2 + c=1: 4 requests = 6; the 8th request kills the server mid-level (c=2); c=4 is skipped.
    # `broken` dies before it binds its port (an AssertionError in its argument checks).
    body = """\
    methods:
      flaky: {args: [--fail-mode, die-mid-level, --fail-after-requests, "8"]}
      broken: {args: [--fail-mode, die-at-start]}
    """
    path, _ = lab.campaign(body, concurrency="[1, 2, 4]")
    out = lab.tmp / "out"
    p = bench_run(lab, path, out)
    assert p.returncode == 1, p.stderr
    recs = records(out)
    assert_honest(recs)
    k = by_key(recs)
    assert [(r["label"], r["concurrency"], r["status"]) for r in recs] == [
        ("flaky-tp1", 1, "ok"), ("flaky-tp1", 2, "crashed"), ("flaky-tp1", 4, "skipped"),
        ("broken-tp1", 1, "crashed"), ("broken-tp1", 2, "crashed"), ("broken-tp1", 4, "crashed")]
    crashed = k[("flaky-tp1", "chat:short:out24", 2, 0)]
    assert crashed["error"].startswith("server crashed (server process exited with rc 1); server log: ")
    assert "illegal instruction" in crashed["error"]
    # The excerpt is the remote log's own lines, copied back over SSH (numbered as in the mirror).
    remote_log = lab.remote_logs()["flaky-tp1.log"].decode()
    assert "CUDA error: an illegal instruction was encountered" in crashed["log_excerpt"]
    for line in crashed["log_excerpt"].splitlines():
        assert line.split(": ", 1)[1] in remote_log
    assert "not run: the server crashed during workload chat:short:out24 at concurrency 2" in \
        k[("flaky-tp1", "chat:short:out24", 4, 0)]["error"]
    broken = k[("broken-tp1", "chat:short:out24", 1, 0)]
    assert broken["error"].startswith("server never became ready: server process exited with rc 1; server log: ")
    assert broken["error"].endswith("] AssertionError"), broken["error"]
    assert "Traceback (most recent call last):" in broken["log_excerpt"]
    for name, data in lab.remote_logs().items():
        assert (out / "logs" / name).read_bytes() == data


def test_sigkill_then_resume_over_ssh_has_no_duplicate_or_lost_records(lab):
    body = """\
    methods:
      baseline: {baseline: true}
      eagle3: {args: [--accept-length, "2", --decode-tok-s, "200"]}
    """
    path, port = lab.campaign(body, concurrency="[1, 2, 3]", decode="100")
    out = lab.tmp / "out"
    cmd = [sys.executable, "-m", "tests.rooted", "bench", "run", str(path), "--out", str(out), "--inventory",
           str(lab.inventory)]
    proc = subprocess.Popen(cmd, env=env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(records(out)) < 2:
        time.sleep(0.05)
    time.sleep(0.3)  # now a level of the first server is in flight
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = records(out)
    assert 2 <= len(before) < 6
    assert_honest(before)
    info = json.loads((out / "server.pid").read_text())
    assert info["host"] == "ct200" and info["log"].startswith(str(lab.remote_dir))
    cmdline = Path(f"/proc/{info['pid']}/cmdline").read_bytes().split(b"\0")[:-1]
    assert [a.decode() for a in cmdline] == info["argv"]  # the killed runner left its server running on ct200

    p = bench_run(lab, path, out, "--resume")
    assert p.returncode == 0, p.stderr
    assert f"stopped server left running on ct200 by an interrupted campaign (pid {info['pid']})" in p.stderr
    after = records(out)
    assert_honest(after)
    assert sorted((r["label"], r["concurrency"]) for r in after) == sorted(
        (label, c) for label in ("baseline-tp1", "eagle3-tp1") for c in (1, 2, 3))
    assert after[: len(before)] == before  # nothing recorded before the kill was rewritten
    assert all(r["status"] == "ok" for r in after)
    state = Path(f"/proc/{info['pid']}/stat")
    assert not state.exists() or state.read_text().rsplit(") ", 1)[1].startswith("Z")
    assert len(lab.gate_calls()) >= 2  # the resumed run gated ct200 again


def test_model_files_are_read_on_the_target(lab):
    # /models/llama exists only on ct200 (its file reads are mapped under lab.files): the prompts are cut to
    # exact lengths with ct200's tokenizer.json, and sglang validate (run here) judges tp 4 with ct200's
    # config.json: 6 attention heads cannot split over 4 GPUs, so that server is never launched.
    from tests.bench.test_prompts_tokens import make_tokenizer_dir

    model = lab.files / "models" / "llama"
    model.parent.mkdir(parents=True, exist_ok=True)
    make_tokenizer_dir(lab.files / "models").rename(model)
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 768, "num_attention_heads": 6,
        "num_key_value_heads": 2, "num_hidden_layers": 4, "intermediate_size": 2048, "vocab_size": 32000,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}))
    body = """\
    validate: true
    methods:
      baseline: {baseline: true, tp: [1]}
      wide: {tp: [4]}
    """
    path, _ = lab.campaign(body, concurrency="[1]")
    text = path.read_text().replace(f"model: {lab.tmp}/model", "model: /models/llama").replace("tp: [1]", "tp: [1, 4]")
    path.write_text(text.replace("    num_prompts: 4", "    num_prompts: 4\n    context_lengths: [1000]"))
    out = lab.tmp / "out"
    p = bench_run(lab, path, out)
    assert p.returncode == 1, p.stderr
    k = by_key(records(out))
    ok = k[("baseline-tp1", "chat:ctx1000:out24", 1, 0)]
    assert ok["status"] == "ok" and ok["prompt_tokens_mean"] == 1000  # input_ids of exactly 1000 tokens
    wide = k[("wide-tp4", "chat:ctx1000:out24", 1, 0)]
    assert wide["status"] == "error" and wide["error"].startswith("not launched: sglang validate says")
    assert "6 attention heads do not split over tp 4" in wide["error"]
    assert json.loads((out / "campaign.json").read_text())["token_counts"] == \
        "exact: ct200:/models/llama/tokenizer.json"
    assert set(lab.remote_logs()) == {"baseline-tp1.log"}  # wide-tp4 was never started


def test_real_gate_over_ssh_stops_the_campaign(lab):
    # gpudoctor's own gate, judged in this process on ct200 (this machine, through sshd), which has no NVIDIA driver.
    path, _ = lab.campaign("methods: {baseline: {}}\n", gate=f"[{sys.executable}, -m, gpudoctor, gate, --profile, "
                                                           "benchmark]")
    out = lab.tmp / "out"
    p = bench_run(lab, path, out)
    assert p.returncode == 2, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("gpudoctor: gate failed before baseline-tp1, campaign stopped (nothing recorded for it): ")
    head = (f": gpudoctor gate, profile benchmark, on ct200 --model {lab.tmp}/model → exit 2: "
            "BLOCK host.driver.loaded: No NVIDIA driver is loaded — fix: ")
    # the fix as this machine deserves it: no NVIDIA device on its PCI bus (CI), or one the driver should take
    fixes = ("No NVIDIA device on the PCI bus (/sys/bus/pci/devices has no vendor 10de display device): no driver can "
             "help until one is seated, powered and enabled in the firmware.",
             "Install or load the NVIDIA driver (modprobe nvidia).")
    assert any(last.endswith(head + fix + " (and 9 more: gpudoctor gate --host ct200)") for fix in fixes), last
    assert records(out) == [] and lab.remote_logs() == {}


def test_gpudoctor_gate_is_judged_in_process_on_the_target(lab, monkeypatch):
    # `gpudoctor gate` in a campaign is not a command to run: the runner judges it in its own process on ct200,
    # opened through the campaign's inventory (whose profile applies), with each configuration's models. A gpudoctor
    # on PATH that records its calls proves no CLI ran.
    monkeypatch.setenv("PATH", f"{lab.gate.parent}:{os.environ['PATH']}")
    lab.inventory.write_text(lab.inventory.read_text() + "profiles:\n  lab:\n    require: ['workload.model.*']\n"
                                                         "    fail_free: false\n")
    write_model(lab.files / str(lab.tmp / "model").lstrip("/"), shards=2, elems=64)  # complete on ct200
    body = """\
    methods:
      baseline: {baseline: true}
      eagle3: {args: [--speculative-algorithm, EAGLE3], draft_model: /models/draft}
    """  # /models/draft is an empty directory on ct200
    path, _ = lab.campaign(body, concurrency="[1]", gate="[gpudoctor, gate, --profile, lab]")
    out = lab.tmp / "out"
    p = bench_run(lab, path, out)
    assert p.returncode == 2, p.stderr
    assert f"gate passed: gpudoctor gate, profile lab, on ct200 --model {lab.tmp}/model\n" in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gpudoctor: gate failed before eagle3-tp1, campaign stopped (nothing recorded for it): "
                           f"gpudoctor gate, profile lab, on ct200 --model {lab.tmp}/model --model /models/draft "
                           f"→ exit 2: BLOCK workload.model.complete[/models/draft]: /models/draft: model incomplete"), last
    assert [(r["label"], r["status"]) for r in records(out)] == [("baseline-tp1", "ok")]
    assert lab.gate_calls() == []


def test_gpus_not_released_on_the_target_stop_the_campaign(lab):
    lab.smi_busy.write_text("1000000")
    path, _ = lab.campaign("methods: {baseline: {}}\n", concurrency="[1]")
    path.write_text(path.read_text().replace("gpu_release_s: 10", "gpu_release_s: 1.5"))
    out = lab.tmp / "out"
    p = bench_run(lab, path, out)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        "gpudoctor: after stopping baseline-tp1: GPUs not released after 1.5 s: 1 compute process(es) still hold GPU "
        "memory: 4242, 70000 (on ct200)")
    assert [r["status"] for r in records(out)] == ["ok"]
    assert not (out / "server.pid").exists()  # the server itself was stopped (the fixture checks nothing runs)


def bad_inventory_cases(lab, sshd):
    """(inventory text, campaign edit, line of the campaign or None, expected exit, message)."""
    unknown_key = lab.tmp / "empty_known_hosts"
    unknown_key.write_text("")
    good = lab.inventory.read_text()
    return [
        (good, lambda t: t.replace("target: ct200", "target: ct999"), 2, 3,
         "target 'ct999' is not a host of the inventory {inv} (hosts: ct200)"),
        (good.replace("127.0.0.1", "192.0.2.10"), lambda t: t, 2, 3,
         "target ct200 is reached at 192.0.2.10, but its servers would listen on 127.0.0.1 (server.host), which "
         "this machine cannot reach: set server.host: 0.0.0.0"),
        (good.replace(str(sshd.known_hosts), str(unknown_key)), lambda t: t, None, 3,
         "ct200: unknown SSH host key for [127.0.0.1]"),
        (good.replace(f"port: {sshd.port}", "port: 9"), lambda t: t, None, 2,
         "cannot reach the campaign's target: ct200: connection to"),
        ("hosts:\n  ct200: {adress: x}\n", lambda t: t, None, 3, "unknown key 'adress' in host ct200"),
    ]


def test_bad_target_is_one_line_and_nothing_runs(lab, sshd, capsys):
    from gpudoctor.cli import main

    for i, (inventory, edit, line, code, message) in enumerate(bad_inventory_cases(lab, sshd)):
        inv = lab.tmp / f"inv{i}.yaml"
        inv.write_text(inventory)
        path, _ = lab.campaign("methods: {baseline: {}}\n", name=f"c{i}.yaml")
        path.write_text(edit(path.read_text()))
        out = lab.tmp / f"out{i}"
        with pytest.raises(SystemExit) as exc:
            main(["bench", "run", str(path), "--out", str(out), "--inventory", str(inv)])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == code, (message, err)
        assert "\n" not in err and "Traceback" not in err, err
        if line is not None:
            assert err.startswith(f"gpudoctor: {path}:{line}: "), err
        assert message.format(inv=inv) in err, err
        assert not out.exists()  # nothing half-written
    assert lab.gate_calls() == [] and not lab.remote_dir.exists()


def test_ssh_lost_mid_campaign_stops_it_and_resume_finishes(lab, sshd, cut_proxy):
    # ct200 is reached through a proxy that goes away after the first record (the open connection is cut too):
    # the levels in flight still run
    # (the load does not use SSH), but the server cannot be stopped, so the campaign stops (exit 2) with the
    # reason. ct200 reachable again: --resume stops the server left there and finishes without duplicates.
    proxy = cut_proxy()
    known = lab.tmp / "known_hosts"
    known.write_text(sshd.known_hosts_line(proxy.port) + sshd.known_hosts_line())
    direct = lab.inventory.read_text().replace(str(sshd.known_hosts), str(known))
    lab.inventory.write_text(direct.replace(f"port: {sshd.port}", f"port: {proxy.port}"))
    body = """\
    methods:
      baseline: {baseline: true}
      eagle3: {args: [--accept-length, "2"]}
    """
    path, _ = lab.campaign(body, concurrency="[1, 2]", decode="200")
    out = lab.tmp / "out"
    cmd = [sys.executable, "-m", "tests.rooted", "bench", "run", str(path), "--out", str(out), "--inventory",
           str(lab.inventory)]
    proc = subprocess.Popen(cmd, env=env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not records(out):
        time.sleep(0.02)
    proxy.stay_down, proxy.cuts = True, 1  # every new connection is cut at once
    assert sshd.cut_connections() >= 1  # and the open one drops (its sshd process killed)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpudoctor: lost ct200 while running baseline-tp1: ct200: ") and \
        last.endswith("; rerun with --resume (it first stops a server left running there)"), last
    before = records(out)
    assert_honest(before)
    assert [r["label"] for r in before] == ["baseline-tp1"] * len(before) and before
    info = json.loads((out / "server.pid").read_text())
    assert Path(f"/proc/{info['pid']}/cmdline").read_bytes().split(b"\0")[:-1] == \
        [a.encode() for a in info["argv"]]  # still running on ct200

    lab.inventory.write_text(direct)
    p = bench_run(lab, path, out, "--resume")
    assert p.returncode == 0, p.stderr
    assert f"stopped server left running on ct200 by an interrupted campaign (pid {info['pid']})" in p.stderr
    after = records(out)
    assert after[: len(before)] == before
    assert sorted((r["label"], r["concurrency"]) for r in after) == [
        ("baseline-tp1", 1), ("baseline-tp1", 2), ("eagle3-tp1", 1), ("eagle3-tp1", 2)]
    assert all(r["status"] == "ok" for r in after)


def test_gate_and_heal_commands_aimed_at_the_target(tmp_path, monkeypatch):
    from gpudoctor.campaign.file import load
    from gpudoctor.campaign.runner import Runner
    from gpudoctor.host.local import LocalHost

    path = tmp_path / "c.yaml"
    path.write_text("target: ct200\nmodel: /m\ntp: [1]\nmethods: {baseline: {}}\n"
                    "workloads: [{name: w, max_tokens: 8}]\nconcurrency: [1]\n")
    runner = Runner(load(str(path)), str(tmp_path / "out"), host=LocalHost(), inventory_path="/etc/inv.yaml")
    aim = runner.for_target
    monkeypatch.setenv("PATH", str(tmp_path))  # no gpudoctor on PATH: the running one is used
    assert aim(["gpudoctor", "gate", "--profile", "benchmark"]) == [
        sys.executable, "-I", "-m", "gpudoctor", "gate", "--profile", "benchmark", "--host", "ct200", "--inventory",
        "/etc/inv.yaml"]
    assert aim(["/opt/gd/bin/gpudoctor", "fix", "--apply", "--yes"])[-4:] == [
        "--host", "ct200", "--inventory", "/etc/inv.yaml"]
    assert aim(["gpudoctor", "gate", "--host=kpro6"])[-1] == "--host=kpro6"  # the user's own --host wins
    assert aim(["sh", "-c", "ssh ct200 nvidia-smi"]) == ["sh", "-c", "ssh ct200 nvidia-smi"]  # not gpudoctor's
