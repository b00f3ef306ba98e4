"""A server that dies, hangs, fails or never becomes ready gives crashed/error records with reasons, never zeros."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.bench.conftest import REPO, env, run_cli


def records(out):
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def assert_no_fake_ok(recs):
    for r in recs:
        if r["status"] == "ok":
            assert r["output_tok_per_s"] and r["output_tok_per_s"] > 0 and r["completed"] == r["requests"]
        else:
            assert r["error"], r
            assert r["output_tok_per_s"] is None and r["ttft_ms_p50"] is None and r["accept_length"] is None


def load(s, out, *extra, conc="2,4", max_tokens="32"):
    return run_cli("bench", "load", "--server-url", s.url, "--concurrency", conc, "--max-tokens", max_tokens,
                   "--prompts", "8", "--server-log", str(s.log), "--out", str(out), *extra)


def test_server_dies_mid_level(standin, tmp_path):
    # 2 warm-up requests, then the 6th request (4th of the first level) kills the server 50 ms later.
    s = standin("--decode-tok-s", "200", "--accept-length", "2", "--fail-mode", "die-mid-level",
                "--fail-after-requests", "6")
    out = tmp_path / "out"
    p = load(s, out)
    assert p.returncode == 2
    first, second = recs = records(out)
    assert_no_fake_ok(recs)
    assert first["status"] == "crashed" and first["concurrency"] == 2
    assert "server crashed" in first["error"] and "illegal instruction" in first["error"]
    assert "RuntimeError: CUDA error: an illegal instruction was encountered" in first["log_excerpt"]
    assert "Traceback" in first["log_excerpt"]
    assert first["completed"] < first["requests"]
    assert second["status"] == "skipped" and "the server crashed during" in second["error"]
    assert "CRASHED" in p.stderr


def test_server_dies_after_seconds(standin, tmp_path):
    s = standin("--decode-tok-s", "25", "--fail-mode", "die-mid-level", "--fail-after-s", "1.5")  # level: 0.6..3.2 s
    out = tmp_path / "out"
    p = load(s, out, conc="4")
    assert p.returncode == 2
    (r,) = records(out)
    assert r["status"] == "crashed" and "illegal instruction" in r["error"]


def test_server_hangs(standin, tmp_path):
    s = standin("--decode-tok-s", "200", "--fail-mode", "hang", "--fail-after-requests", "4",
                "--health-timeout-s", "1")
    out = tmp_path / "out"
    p = load(s, out, "--stall-timeout", "1")
    assert p.returncode == 2
    first, second = recs = records(out)
    assert_no_fake_ok(recs)
    assert first["status"] == "error" and "stopped sending (hang)" in first["error"]
    assert second["status"] == "skipped" and "unhealthy" in second["error"]


def test_http_500(standin, tmp_path):
    s = standin("--decode-tok-s", "500", "--fail-mode", "http500", "--fail-after-requests", "3")
    out = tmp_path / "out"
    p = load(s, out, conc="2")
    assert p.returncode == 2
    (r,) = records(out)
    assert_no_fake_ok([r])
    assert r["status"] == "error" and "HTTP 500" in r["error"]
    assert "Exception in ASGI application" in r["log_excerpt"]


def test_error_chunk_under_http_200(standin, tmp_path):
    # SGLang reports a ValueError inside a 200 stream as `data: {"error": ...}`: the status code alone lies.
    s = standin("--decode-tok-s", "500", "--fail-mode", "error-chunk", "--fail-after-requests", "3")
    out = tmp_path / "out"
    assert load(s, out, conc="2").returncode == 2
    (r,) = records(out)
    assert r["status"] == "error" and "error in stream: stand-in fault: error-chunk" in r["error"]


def test_never_ready(standin, tmp_path):
    s = standin("--fail-mode", "never-ready", ready=False)
    out = tmp_path / "out"
    p = load(s, out, "--ready-timeout", "1.5")
    assert p.returncode == 2
    recs = records(out)
    assert [r["concurrency"] for r in recs] == [2, 4]
    assert_no_fake_ok(recs)
    for r in recs:
        assert r["status"] == "error" and "server not ready" in r["error"] and "HTTP 503" in r["error"]
        assert "Load weight begin" in r["log_excerpt"]


def test_consistent_http_500_while_waiting_is_said_within_seconds(standin, tmp_path):
    # transformers serve in a broken environment answered 500 to every request, and bench load waited its whole
    # --ready-timeout in silence (480 s) (#33): a consistent 5xx with a body ends the wait in seconds, in its words.
    s = standin("--flavor", "openai", "--fail-mode", "http500", "--fail-after-requests", "1")
    out = tmp_path / "out"
    t0 = time.monotonic()
    p = run_cli("bench", "load", "--server-url", s.url, "--api", "completions", "--concurrency", "1,2",
                "--max-tokens", "8", "--prompts", "2", "--ready-timeout", "300", "--out", str(out), timeout=90)
    took = time.monotonic() - t0
    assert p.returncode == 2, p.stderr
    assert took < 60, took
    recs = records(out)
    assert [r["concurrency"] for r in recs] == [1, 2]
    assert_no_fake_ok(recs)
    for r in recs:
        assert r["status"] == "error" and r["error"].startswith("server not ready: the server answered HTTP 500 to all")
        assert r["error"].count("Internal Server Error") == 1 and "--wait-through-5xx" in r["error"], r["error"]
    assert "not ready in 300 s" not in p.stderr


def test_wait_through_5xx_says_it_once_and_waits_for_the_server(standin, tmp_path):
    # The user asked to wait: the 500 is said once, within seconds, and the run goes on when the server recovers.
    fault = tmp_path / "broken-env"
    fault.write_text("")
    s = standin("--flavor", "openai", "--fail-mode", "http500", "--fail-after-requests", "1",
                "--fail-if-exists", str(fault))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "tests.rooted", "bench", "load", "--server-url", s.url,
                             "--api", "completions", "--concurrency", "1", "--max-tokens", "8", "--prompts", "2",
                             "--ready-timeout", "120", "--wait-through-5xx", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=REPO)
    try:
        t0 = time.monotonic()
        said = None
        for line in proc.stderr:
            if "HTTP 500" in line:
                said = (line, time.monotonic() - t0)
                break
        assert said is not None, proc.wait(timeout=5)
        line, after = said
        assert after < 30, after
        assert "answered HTTP 500 to all" in line and "Internal Server Error" in line and "waiting up to 120 s" in line
        fault.unlink()  # the environment is repaired: the next probe passes
        _, rest = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    assert "HTTP 500" not in rest  # said once
    (r,) = records(out)
    assert r["status"] == "ok" and r["completed"] == 2


def test_prompt_over_context_is_skipped_not_sent(standin, tmp_path):
    s = standin("--decode-tok-s", "5000", "--context-length", "1000")
    out = tmp_path / "out"
    p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "1", "--max-tokens", "200",
                "--context-len", "900", "--prompts", "2", "--warmup", "0", "--out", str(out))
    assert p.returncode == 2
    (r,) = records(out)
    assert r["status"] == "skipped" and "> context limit 1000" in r["error"] and "not sent" in r["error"]
    assert "[http_server] Error" not in s.log_text()  # the server never saw it
    out2 = tmp_path / "out2"
    p = run_cli("bench", "load", "--server-url", s.url, "--concurrency", "1", "--max-tokens", "100",
                "--context-len", "500", "--prompts", "2", "--out", str(out2))
    assert p.returncode == 0, p.stderr
    (r,) = records(out2)
    assert r["status"] == "ok" and r["prompt_tokens_mean"] == 500  # the stand-in counts text at 4 chars/token


def test_bad_flags_exit_3(tmp_path):
    p = run_cli("bench", "load", "--server-url", "http://127.0.0.1:9", "--concurrency", "1,x", "--max-tokens", "8",
                "--out", str(tmp_path / "o"))
    assert p.returncode == 3 and "Invalid value for '--concurrency': '1,x': 'x' is not an integer" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()


def test_a_port_nothing_listens_on_is_said_at_once(tmp_path):
    """#41: against a wrong port bench load said nothing for --ready-timeout, then claimed the server "publishes
    none". Now its first lines say nothing answers there, and that it waits; the level is still an error record."""
    import socket

    with socket.socket() as sk:  # a port nothing listens on: bound, never listening
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
        out = tmp_path / "out"
        p = run_cli("bench", "load", "--server-url", f"http://127.0.0.1:{port}", "--concurrency", "1",
                    "--max-tokens", "8", "--ready-timeout", "2", "--out", str(out))
    lines = p.stderr.splitlines() + p.stdout.splitlines()
    assert p.returncode == 2, p.stderr
    assert "publishes none" not in p.stderr + p.stdout
    assert any(f"nothing answers at http://127.0.0.1:{port} yet (127.0.0.1:{port}: connection refused): waiting up "
               f"to 2 s (--ready-timeout)" in line for line in lines), lines
    assert [r["status"] for r in records(out)] == ["error"]
