"""The stand-in is a command (#23): `gpudoctor bench standin` takes the module's options and serves; a campaign can
name it as its server; `python3 -m gpudoctor.bench.standin` still runs. Through the installed console script."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

from tests.bench.campaigns import write
from tests.bench.conftest import free_port, run_cli, wait_http
from tests.console import console_script, gpudoctor


def test_the_command_serves_with_the_modules_options_and_stops_on_sigterm(tmp_path):
    port = free_port()
    log = tmp_path / "standin.log"
    p = subprocess.Popen([console_script(), "bench", "standin", "--port", str(port), "--decode-tok-s", "200",
                          "--accept-length", "2", "--log-file", str(log), "--some-sglang-flag", "7"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_http(f"http://127.0.0.1:{port}/ready", want=200) == 200, log.read_text() if log.exists() else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
            info = json.loads(r.read())
        assert info["standin"]["decode_tok_s"] == 200 and info["standin"]["accept_length"] == 2
        assert "--some-sglang-flag" in json.dumps(info)  # any other flag is accepted, as with the module
        assert "The server is fired up and ready to roll!" in log.read_text()
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=10)
    assert p.returncode == 0 and b"Traceback" not in err


def test_its_help_is_the_modules_under_the_commands_name():
    r = gpudoctor("bench", "standin", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: gpudoctor bench standin ")
    assert "--decode-tok-s" in r.stdout and "--fail-mode" in r.stdout
    assert "bench standin" in gpudoctor("bench", "--help").stdout


def test_a_bad_option_is_one_line_exit_3():
    r = gpudoctor("bench", "standin", "--port", "x")
    assert r.returncode == 3 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["gpudoctor: bench standin: argument --port: invalid int value: 'x'"]


def test_the_module_still_runs_with_the_running_interpreter():
    r = subprocess.run([sys.executable, "-m", "gpudoctor.bench.standin", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: python3 -m gpudoctor.bench.standin ")


def test_a_campaign_names_the_command_as_its_server(tmp_path):
    path, _ = write(tmp_path, "methods: {baseline: {}}\n", concurrency="[1]")
    text = path.read_text()
    module = f"[{sys.executable}, -m, gpudoctor.bench.standin,"
    assert module in text
    path.write_text(text.replace(module, f"[{console_script()}, bench, standin,"))
    out = tmp_path / "out"
    p = run_cli("bench", "run", str(path), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert f"starting: {console_script()} bench standin" in p.stderr
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["status"] for r in recs] == ["ok"] and recs[0]["output_tok_per_s"] > 0
