"""The real CLI on this CPU-only machine: fast, plain about the missing driver, JSON valid, bad input exit 3."""

import json
import os
import subprocess
import sys
import time

import jsonschema

from .conftest import SNAPSHOTS

SCHEMA = json.loads((SNAPSHOTS.parents[2] / "gpudoctor" / "data" / "check.schema.json").read_text())


def gd(*args, env=None, timeout=60):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


def test_check_without_driver_is_fast_and_plain():
    t = time.perf_counter()
    r = gd("check")
    took = time.perf_counter() - t
    assert took < 2.0
    assert r.returncode in (2, 3)
    assert "No NVIDIA driver is loaded" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_check_json_validates():
    r = gd("check", "--json")
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit_code"] == r.returncode == 2
    assert doc["root_cause"]["id"] == "host.driver.loaded"
    symptoms = [f for f in doc["findings"] if f["blocked_by"] == "host.driver.loaded"]
    assert {f["id"] for f in symptoms} >= {"devices.node.present"}
    cuda = next(f for f in doc["findings"] if f["id"] == "cuda.init")
    if cuda["summary"] == "libcuda.so.1 cannot be loaded":  # a missing library is its own cause, not the driver's symptom
        assert cuda["blocked_by"] is None and "cuda.init" in doc["other_causes"]
    else:
        assert cuda["blocked_by"] == "host.driver.loaded"


def test_snapshot_round_trip_through_the_cli(tmp_path):
    out = tmp_path / "snap.json"
    r = gd("snapshot", "-o", str(out))
    assert r.returncode == 0 and out.exists()
    doc = json.loads(out.read_text())
    assert doc["schema"] == "gpudoctor.snapshot/1" and doc["transcript"]
    assert not any("TOKEN" in k or "SECRET" in k for k in doc["facts"].get("fabric", {}).get("env", {}))
    live = json.loads(gd("check", "--json").stdout)
    replay = json.loads(gd("check", "--json", "--snapshot", str(out)).stdout)
    assert replay["verdict"] == live["verdict"] and replay["root_cause"]["key"] == live["root_cause"]["key"]


def test_snapshot_never_holds_secrets(tmp_path):
    out = tmp_path / "snap.json"
    gd("snapshot", "-o", str(out), env={"NCCL_IB_AUTH_TOKEN": "hunter2", "HF_TOKEN": "hf_secret", "NCCL_DEBUG": "INFO"})
    text = out.read_text()
    assert "hunter2" not in text and "hf_secret" not in text
    assert json.loads(text)["facts"]["fabric"]["env"]["NCCL_DEBUG"] == "INFO"


def test_only_and_explain():
    r = gd("check", "--json", "--only", "fabric")
    assert {f["layer"] for f in json.loads(r.stdout)["findings"]} == {"fabric"}
    r = gd("check", "--explain", "devices.node.open")
    assert r.returncode == 0 and "EPERM" in r.stdout and "boundary.lxc.cgroup_allow" in r.stdout


def test_checks_lists_every_id_once():
    r = gd("checks", "--json")
    doc = json.loads(r.stdout)
    assert doc["schema"] == "gpudoctor.checks/1"
    ids = [c["id"] for c in doc["checks"]]
    assert len(ids) == len(set(ids)) and "cuda.init" in ids and "devices.node.major" in ids


BAD = [
    (["check", "--timeout", "0"], "--timeout"),
    (["check", "--only", "gpu"], "--only"),
    (["check", "--expect-gpus", "-1"], "--expect-gpus"),
    (["check", "--explain", "no.such.check"], "unknown check id"),
    (["check", "--bogus"], "--bogus"),
    (["nosuchcommand"], "nosuchcommand"),
]


def test_bad_flags_one_line_exit_3():
    for argv, word in BAD:
        r = gd(*argv)
        assert r.returncode == 3, argv
        assert word in r.stderr and "Traceback" not in r.stderr, argv
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bad_snapshot_files(tmp_path):
    (tmp_path / "bad.json").write_text('{"schema": "gpudoctor.snapshot/1",\n  "facts": [1, 2,\n}')
    (tmp_path / "other.json").write_text('{"schema": "something/else"}')
    cases = {str(tmp_path / "missing.json"): "no such snapshot file",
             str(tmp_path / "bad.json"): "bad.json:3:",
             str(tmp_path / "other.json"): "not a gpudoctor snapshot"}
    for path, word in cases.items():
        r = gd("check", "--snapshot", path)
        assert r.returncode == 3 and word in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_live_check_leaves_fast_and_still_prints_everything_with_its_exit_code():
    """The CLI process of a live check skips the interpreter's teardown (os._exit) only after flushing: the JSON is
    whole, the exit code the verdict's, and no probe it started outlives it."""
    import json as _json
    import subprocess as _sp
    import sys as _sys

    p = _sp.run([_sys.executable, "-m", "gpudoctor", "check", "--json", "--timeout", "20"], capture_output=True,
                text=True, timeout=120)
    doc = _json.loads(p.stdout)
    assert p.returncode == doc["exit_code"]
    text = _sp.run([_sys.executable, "-m", "gpudoctor", "check", "--timeout", "20"], capture_output=True, text=True,
                   timeout=120)
    assert text.returncode == doc["exit_code"] and text.stdout.startswith("gpudoctor check ")
    assert text.stdout.rstrip().splitlines()[-1].strip()  # the table's last row came out
