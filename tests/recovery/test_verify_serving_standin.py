"""The serving smoke's rules where `transformers serve` cannot show them, against the SGLang stand-in (a real
process speaking SGLang's and vLLM's wire protocols with a known truth; tests/bench/conftest.py): exact token counts
with ignore_eos on the native API and vLLM's /v1, a server that errs mid-smoke fails with its words, a TTFT above the
ceiling fails with the numbers (#31). The real third-party server is tests/recovery/test_verify_serving.py."""

from __future__ import annotations

import pytest

from gpudoctor.inventory import parse_inventory
from gpudoctor.recovery.verify import VerifyPolicy, run_verification
from gpudoctor.target import open_target
from tests.bench.conftest import StandIn

SMOKE = VerifyPolicy(deep="off", smoke_requests=6, smoke_max_tokens=12, smoke_ttft_ms_max=10000.0, timeout_s=120.0)


@pytest.fixture
def start(tmp_path):
    started = []

    def go(*args):
        s = StandIn(tmp_path, *args)
        started.append(s)
        return s

    yield go
    for s in started:
        s.stop()


def verify(url: str, model: str, api: str, policy: VerifyPolicy = SMOKE):
    inv = parse_inventory(f"hosts:\n  gpu1:\n    address: local\n    serving: {{url: '{url}', model: '{model}', "
                          f"api: {api}}}\n", path="inv.yaml")
    return run_verification(open_target("gpu1", inv), policy)


@pytest.mark.parametrize("flavor, api", [("sglang", "native"), ("sglang", "completions"), ("vllm", "chat")])
def test_exact_token_counts_where_the_server_takes_ignore_eos(start, flavor, api):
    s = start("--flavor", flavor, "--decode-tok-s", "400", "--ttft-ms", "20", "--served-model-name", "tiny-m",
              *(["tiny-m"] if flavor == "vllm" else []))
    v = verify(s.url, "tiny-m", api)
    assert v.passed, v.reason + s.log_text()[-500:]
    detail = {x.name: x for x in v.steps}["serving"].detail
    assert f"{s.url} (tiny-m, {api}): 6 requests ok, 72 tokens" in detail, detail


def test_a_server_that_errs_mid_smoke_fails_with_its_words(start):
    s = start("--decode-tok-s", "400", "--fail-mode", "http500", "--fail-after-requests", "3")
    v = verify(s.url, "default", "native")
    assert not v.passed and v.reason.startswith(f"serving: {s.url} (default, native): "), v.reason
    assert "500" in v.reason, v.reason


def test_a_slow_first_token_fails_with_the_numbers(start):
    s = start("--decode-tok-s", "400", "--ttft-ms", "400")
    v = verify(s.url, "default", "native", VerifyPolicy(deep="off", smoke_requests=2, smoke_max_tokens=4,
                                                         smoke_ttft_ms_max=150.0))
    assert not v.passed and "above the ceiling 150 ms (policy.verify.smoke_ttft_ms_max" in v.reason, v.reason


def test_a_loopback_url_of_a_host_reached_over_ssh_is_refused():
    """Nothing is sent: the smoke would have tested this machine's server instead of gpu7's."""
    inv = parse_inventory("hosts:\n  gpu7:\n    address: 192.0.2.7\n    serving: {url: 'http://127.0.0.1:30000', "
                          "model: m}\n", path="inv.yaml")
    v = run_verification(open_target("gpu7", inv), VerifyPolicy(deep="off"))
    assert not v.passed
    assert v.reason == ("serving: serving.url http://127.0.0.1:30000 is this machine's loopback, but gpu7 is reached "
                        "over SSH: the smoke would test this machine; give gpu7's address (or run the daemon on "
                        "gpu7)"), v.reason
