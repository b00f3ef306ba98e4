"""`bench load` open loop and error budgets from the CLI, and the campaign keys that ask for them."""

from __future__ import annotations

import json

import pytest

from gpudoctor.campaign.file import load
from gpudoctor.bench.client.pacing import arrival_offsets
from gpudoctor.errors import ConfigError
from tests.bench.campaigns import write
from tests.bench.conftest import run_cli


def test_request_rate_level_keeps_its_rate_and_counts_goodput(standin, tmp_path):
    s = standin("--decode-tok-s", "400", "--ttft-ms", "10")
    p = run_cli("bench", "load", "--server-url", s.url, "--api", "completions", "--request-rate", "25",
                "--arrival", "constant", "--max-tokens", "8", "--prompts", "20", "--slo-ttft-ms", "1000",
                "--slo-itl-ms", "1000", "--out", str(tmp_path / "out"), "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["status"] == "ok" and r["request_rate"] == 25 and r["arrival"] == "constant" and r["concurrency"] is None
    assert r["achieved_req_per_s"] == pytest.approx(25, rel=0.05)
    assert r["send_late_ms_p50"] >= 0 and r["send_late_ms_p99"] >= r["send_late_ms_p50"]  # bench/pacing.py times it
    assert r["goodput_req_per_s"] == pytest.approx(20 / r["duration_s"], rel=1e-4) and r["slo_ok_fraction"] == 1.0
    assert "rate=25/s" in p.stderr


def test_slo_that_nothing_meets_gives_zero_goodput_not_an_error(standin, tmp_path):
    s = standin("--decode-tok-s", "400", "--ttft-ms", "30")
    p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "2", "--max-tokens", "8", "--prompts", "4",
                "--slo-ttft-ms", "5", "--out", str(tmp_path / "out"), "--json")
    r = json.loads(p.stdout)
    assert p.returncode == 0 and r["status"] == "ok" and r["goodput_req_per_s"] == 0 and r["slo_ok_fraction"] == 0


def test_max_error_rate_tolerates_aborts_within_it_and_stops_beyond(standin, tmp_path):
    # 1 running + 1 queued: of 6 requests at concurrency 3, some would queue beyond the limit and are aborted.
    s = standin("--decode-tok-s", "100", "--max-running", "1", "--max-queued-requests", "1")
    args = ["bench", "load", "--server-url", s.url, "--concurrency", "3", "--max-tokens", "10", "--prompts", "6",
            "--warmup", "0", "--json"]
    p = run_cli(*args, "--max-error-rate", "0.9", "--out", str(tmp_path / "tolerant"))
    r = json.loads(p.stdout)
    assert p.returncode == 0 and r["status"] == "ok", r
    assert r["failed"] >= 1 and r["completed"] + r["failed"] == 6 and 0 < r["error_rate"] < 0.9
    assert "The request queue is full." in r["error"]  # the tolerated failures are named, not hidden
    p = run_cli(*args, "--out", str(tmp_path / "strict"))
    r = json.loads(p.stdout)
    assert p.returncode == 2 and r["status"] == "error" and "aborted by the server (status 503)" in r["error"]
    assert r["completed"] + r["failed"] < 6  # the first failure stopped new requests


def test_arrivals_are_seeded_and_average_the_rate():
    a = arrival_offsets(2000, 100.0, "poisson", seed=3)
    assert a == arrival_offsets(2000, 100.0, "poisson", seed=3) and a != arrival_offsets(2000, 100.0, "poisson", 4)
    assert a[0] == 0 and (len(a) - 1) / a[-1] == pytest.approx(100.0, rel=0.08)
    assert arrival_offsets(3, 4.0, "constant") == [0.0, 0.25, 0.5]
    with pytest.raises(ValueError):
        arrival_offsets(3, 0, "constant")


@pytest.mark.parametrize("extra, message", [
    ("server: {kind: tgi}\n", "server.kind must be one of sglang, vllm"),
    ("server: {kind: vllm, api: native}\n", "server.api must be completions or chat for a vllm server"),
    ("request_rates: [4, -1]\n", "request_rates.1 must be a number"),
    ("arrival: bursty\n", "arrival must be poisson or constant"),
    ("max_error_rate: 2\n", "max_error_rate must be a number >= 0 and <= 1"),
    ("slo: {ttft: 5}\n", "unknown key 'ttft' in slo"),
])
def test_bad_load_keys_are_one_located_error(tmp_path, extra, message):
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", extra=extra)
    text = path.read_text()
    if extra.startswith("server:"):  # merge into the file's own server: mapping
        key = extra.split("{", 1)[1].rstrip("}\n")
        text = text.replace("server:\n", "server:\n  " + key.replace(", ", "\n  ") + "\n", 1)
        text = text.replace(extra, "")
        path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load(str(path))
    assert message in str(exc.value) and exc.value.line, str(exc.value)


def test_request_rates_without_concurrency_is_a_campaign(tmp_path):
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", extra="request_rates: [8, 2]\n")
    path.write_text(path.read_text().replace("concurrency: [1, 2]\n", ""))
    camp = load(str(path))
    assert camp.concurrency == [] and camp.request_rates == [2.0, 8.0] and camp.arrival == "poisson"
