"""The verification's serving smoke against a real server: Hugging Face `transformers serve` (CPU, a tiny
random-weight Llama; tests/bench/transformers_lab.py) as the inventory entry's endpoint. It passes with exact token
counts; with the server stopped it fails and the reason names the endpoint and what the client saw (#31)."""

from __future__ import annotations

import pytest

from gpudoctor.inventory import parse_inventory
from gpudoctor.recovery.verify import VerifyPolicy, run_verification
from gpudoctor.target import open_target

SMOKE = VerifyPolicy(deep="off", serving="auto", smoke_requests=4, smoke_max_tokens=8, smoke_ttft_ms_max=60000.0,
                     timeout_s=300.0)


@pytest.fixture(scope="module")
def tfserve(tmp_path_factory):
    from tests.bench import transformers_lab as lab

    yield from lab.served(tmp_path_factory)


def target_for(url: str, model: str, api: str = "completions"):
    inv = parse_inventory(f"hosts:\n  tf:\n    address: local\n    serving: {{url: '{url}', model: '{model}', "
                          f"api: {api}}}\n", path="inv.yaml")
    return open_target("tf", inv)


@pytest.mark.timeout(900)  # the first test builds the model and starts the server (torch imports)
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_smoke_passes_with_exact_token_counts(tfserve, api):
    t = target_for(tfserve.url, str(tfserve.model), api)
    seen = []
    v = run_verification(t, SMOKE, progress=lambda step, what: seen.append((step, what)))
    assert v.passed, v.reason + " | " + tfserve.tail()
    step = {s.name: s for s in v.steps}["serving"]
    assert step.status == "pass"
    # 4 requests x 8 tokens, counted from the server's usage; the model never ends early
    assert f"{tfserve.url} ({tfserve.model}, {api}): 4 requests ok, 32 tokens (usage), TTFT max" in step.detail
    assert ("serving", "start") in seen and ("serving", "pass") in seen


def test_a_ttft_ceiling_the_server_cannot_meet_fails_with_the_numbers(tfserve):
    t = target_for(tfserve.url, str(tfserve.model))
    v = run_verification(t, VerifyPolicy(deep="off", smoke_requests=2, smoke_max_tokens=4, smoke_ttft_ms_max=1.0))
    assert not v.passed
    assert v.reason.startswith(f"serving: {tfserve.url} ") and "above the ceiling 1 ms" in v.reason, v.reason


def test_a_model_the_server_does_not_serve_fails_with_the_servers_words(tfserve):
    t = target_for(tfserve.url, "no-such/model")
    v = run_verification(t, SMOKE)
    assert not v.passed and v.reason.startswith(f"serving: {tfserve.url} is not serving no-such/model: "), v.reason
    assert "HTTP" in v.reason


def test_the_ladder_is_ready_while_it_serves_and_stays_not_ready_when_it_stopped(tfserve, tmp_path):
    """Last in the module: it stops the shared server. The ladder's own sequence (recovery.advance: what the daemon,
    the gates and release run) with this verification: the passing smoke makes the host ready; after a failure the
    checks pass again, but with the server stopped nothing listens on its port, which the verification names, and the host stays not ready."""
    from gpudoctor.recovery.advance import advance
    from gpudoctor.recovery.ladder import READY, VERIFYING, RecoveryPolicy
    from gpudoctor.recovery.store import RecoveryStore

    url = tfserve.url
    t = target_for(url, str(tfserve.model))
    store, pol = RecoveryStore(tmp_path / "recovery.json"), RecoveryPolicy(retry_s=0.0)

    def check(now, passed):
        return advance(store, "tf", pol, now, passed=passed, roots=[] if passed else ["workload.model.complete[m]"],
                       summary="" if passed else "model incomplete", boot_id="boot-1", driver="580.159.04",
                       verify=lambda: run_verification(t, SMOKE), clock=lambda: now)

    adv = check(1000.0, True)
    assert adv.ready and adv.verification.passed, adv.verification and adv.verification.reason
    assert check(1010.0, False).ladder.state == "failing"
    tfserve.stop()
    adv = check(1020.0, True)
    assert not adv.ready and adv.ladder.state == VERIFYING
    v = adv.verification
    # the listener is looked for first (whose server answers, #47): with the server stopped there is none
    port = url.rsplit(":", 1)[1]
    assert not v.passed and v.reason.startswith(f"serving: nothing on tf listens on port {port} of {url}: "), v.reason
    assert "cannot be verified" in v.reason and v.seconds < 60, v.reason
    assert v.reason in adv.ladder.reason  # the one line every surface shows
    assert store.get("tf").state != READY


def test_no_endpoint_is_not_applicable_and_on_without_one_fails():
    inv = parse_inventory("hosts:\n  plain:\n    address: local\n", path="inv.yaml")
    t = open_target("plain", inv)
    v = run_verification(t, VerifyPolicy(deep="off"))
    assert not v.passed and "no serving endpoint in the inventory entry (serving: {url, model})" in v.reason
    v = run_verification(t, VerifyPolicy(deep="off", serving="on"))
    assert not v.passed and v.reason.startswith("serving: policy.verify.serving is on, but the inventory entry "
                                                "names no serving endpoint"), v.reason
