"""`gpudoctor gate`: profiles, exit codes, only-what-blocks output, JSON; on the real H200 snapshots."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from gate_harness import SNAPS, run_gate

from gpudoctor.diagnose import diagnose
from gpudoctor.errors import ConfigError
from gpudoctor.findings import Finding
from gpudoctor.gate import evaluate, resolve_profile
from gpudoctor.snapshot import load
from gpudoctor.target import snapshot_facts


def diag(name):
    return diagnose(snapshot_facts(load(str(SNAPS / f"{name}.json"))))


def test_default_profile_blocks_on_failures_only_root_cause_first():
    r = evaluate(diag("h200-uvm-blocked"), resolve_profile(None))
    assert not r.passed and r.exit_code == 2
    assert r.blockers[0].key == "devices.node.major[/dev/nvidia-uvm]" and r.blockers[0].symptom_of is None
    assert r.blockers[0].hint and "238" in r.blockers[0].hint
    symptoms = [b for b in r.blockers[1:]]
    assert symptoms and all(b.symptom_of == "devices.node.major[/dev/nvidia-uvm]" for b in symptoms)
    assert "cuda.init" in {b.key for b in symptoms}


def test_default_profile_passes_a_warning():
    r = evaluate(diag("h200-uvmtools-000"), resolve_profile("default"))
    assert r.passed and r.exit_code == 0
    assert any(f.status.value == "warn" for f in diag("h200-uvmtools-000").findings)


def test_required_check_that_did_not_run_blocks_and_names_its_cause():
    r = evaluate(diag("h200-healthy"), resolve_profile("benchmark"))
    assert [(b.key, b.status) for b in r.blockers] == [("workload.model.*", "missing")]
    r = evaluate(diag("h200-ctl-blocked"), resolve_profile("benchmark"))
    missing = {b.key: b for b in r.blockers if b.status == "missing"}
    assert missing["cuda.device_count"].symptom_of == "devices.node.major[/dev/nvidiactl]"


def test_required_warn_passes_unknown_blocks_and_bang_ignores():
    d = diag("h200-uvmtools-000")
    assert evaluate(d, resolve_profile("strict", {"strict": ["devices.node.*"]})).passed  # a warning passes
    probe_failed = SimpleNamespace(host="h", findings=[
        Finding("cuda.init", "unknown", "cuInit did not answer in 10 s", hint="look for a hung driver"),
        Finding("driver.nvml.init", "ok", "NVML ok")])
    r = evaluate(probe_failed, resolve_profile("p", {"p": ["cuda.init", "driver.*"]}))
    assert [(b.key, b.status) for b in r.blockers] == [("cuda.init", "unknown")] and r.exit_code == 3
    assert evaluate(probe_failed, resolve_profile(None)).passed  # default: only failures block
    d = diag("h200-uvm-blocked")
    r = evaluate(d, resolve_profile("nvml-only", {"nvml-only": ["driver.nvml.init", "!devices.*", "!cuda.*"]}))
    assert r.passed
    r = evaluate(d, resolve_profile("m", {"m": {"require": ["driver.nvml.init"], "ignore": ["devices.*"]}}))
    assert [b.key for b in r.blockers] == ["cuda.init"]


def test_inventory_profile_objects():
    prof = SimpleNamespace(name="serving", patterns=("cuda.*", "!devices.node.mode"), line=3)
    p = resolve_profile("serving", {"serving": prof})
    assert p.require == ("cuda.*",) and p.ignore == ("devices.node.mode",)


@pytest.mark.parametrize("spec, msg", [
    ("cuda.init", "must be a list of check-id patterns or a mapping"),
    ([1], "must list check-id patterns (strings)"),
    ({"require": "cuda.init"}, "require must be a list"),
    ({"requires": ["x"]}, "unknown key(s) requires"),
    ({"fail_free": "yes"}, "fail_free must be true or false"),
])
def test_bad_profiles_are_config_errors(spec, msg):
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        resolve_profile("p", {"p": spec}, path="inventory.yaml")


def test_cli_prints_only_blockers_one_line_each(tmp_path):
    r = run_gate("--snapshot", str(SNAPS / "h200-uvm-stale-major.json"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("BLOCK devices.node.major[/dev/nvidia-uvm]: /dev/nvidia-uvm is 509:0")
    assert "— fix: " in lines[0] and "`mknod -m 666 /dev/nvidia-uvm c 238 0`" in lines[0]
    assert all(line.startswith("BLOCK ") for line in lines)
    assert any("(symptom of devices.node.major[/dev/nvidia-uvm])" in line for line in lines[1:])
    ok = run_gate("--snapshot", str(SNAPS / "h200-healthy.json"), cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout == ""


def test_cli_json(tmp_path):
    r = run_gate("--snapshot", str(SNAPS / "h200-ctl-blocked.json"), "--json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["schema"] == "gpudoctor.gate/1" and doc["pass"] is False
    assert doc["headline"] == "/dev/nvidiactl is 1:3, but the live nvidia device is 195:255"
    assert doc["blockers"][0]["key"] == "devices.node.major[/dev/nvidiactl]"


def test_cli_inventory_profiles(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(HOSTS + "profiles:\n  gpu-only:\n    - driver.nvml.init\n    - cuda.init\n    - '!devices.*'\n")
    r = run_gate("--snapshot", str(SNAPS / "h200-healthy.json"), "--inventory", str(inv), "--profile", "gpu-only",
                 cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run_gate("--snapshot", str(SNAPS / "h200-uvm-blocked.json"), "--profile", "gpu-only", cwd=tmp_path)
    assert r.returncode == 2  # ./inventory.yaml found by default
    assert any(line.startswith("BLOCK cuda.init") for line in r.stdout.splitlines())


HOSTS = "hosts:\n  ct200:\n    address: 127.0.0.1\n"


def test_cli_inventory_mapping_profile(tmp_path):
    # the mapping form docs/gate.md shows: ignore what may fail, require what must pass
    inv = tmp_path / "inventory.yaml"
    inv.write_text(HOSTS + "profiles:\n  nvml-ok:\n    require: [driver.nvml.init]\n"
                           "    ignore: ['devices.*', 'cuda.*']\n    free_port: true\n")
    blocked = SNAPS / "h200-uvm-blocked.json"
    r = run_gate("--snapshot", str(blocked), "--inventory", str(inv), "--profile", "nvml-ok", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert run_gate("--snapshot", str(blocked), "--inventory", str(inv), cwd=tmp_path).returncode == 2
    inv.write_text(inv.read_text().replace("ignore: ['devices.*', 'cuda.*']", "ignore: ['devices.*']"))
    r = run_gate("--snapshot", str(blocked), "--inventory", str(inv), "--profile", "nvml-ok", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout.startswith("BLOCK cuda.init"), r.stdout


@pytest.mark.parametrize("profile, expect", [
    ("    require: cuda.init\n", "inventory.yaml:6: profile p: require must be a list of strings"),
    ("    require: ['cuda init']\n", "inventory.yaml:6: profile p: require: 'cuda init' is not a check id pattern"),
    ("    max_foreign_mib: -1\n", "inventory.yaml:6: profile 'p': max_foreign_mib must be a number of MiB"),
    ("    fail_free: 'no'\n", "inventory.yaml:6: profile 'p': fail_free must be true or false"),
    ("    free_ports: true\n", "inventory.yaml:6: unknown key 'free_ports' in profile p (did you mean 'free_port'?)"),
])
def test_bad_mapping_profile_is_one_line_at_its_line(tmp_path, profile, expect):
    (tmp_path / "inventory.yaml").write_text(HOSTS + "profiles:\n  p:\n" + profile)
    r = run_gate("--snapshot", str(SNAPS / "h200-healthy.json"), "--profile", "p", cwd=tmp_path)
    assert r.returncode == 3 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr


@pytest.mark.parametrize("args, inv_text, expect", [
    (["--profile", "nope"], None, "unknown gate profile 'nope' (known: benchmark, default, serve)"),
    (["--profile", "nope"], HOSTS + "profiles:\n  mine: [cuda.init]\n",
     "unknown gate profile 'nope' (known: benchmark, default, mine, serve)"),
    (["--profile", "p"], HOSTS + "profiles:\n  p: cuda.init\n", "inventory.yaml:5: profile p must be a list"),
    ([], HOSTS + "profiles: [a, b]\n", "inventory.yaml:4: profiles must be a mapping"),
    ([], HOSTS + "profiles:\n  p: [\n", "inventory.yaml:6: YAML syntax error"),
    ([], "profiles: {}\n", "inventory.yaml:1: the inventory names no hosts"),
    (["--inventory", "missing.yaml"], None, "missing.yaml: no such inventory file"),
])
def test_bad_input_is_one_line_exit_3(tmp_path, args, inv_text, expect):
    if inv_text is not None:
        (tmp_path / "inventory.yaml").write_text(inv_text)
    r = run_gate("--snapshot", str(SNAPS / "h200-healthy.json"), *args, cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and expect in r.stderr and "Traceback" not in r.stderr
