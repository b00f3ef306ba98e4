"""`gpudoctor fix` through the real CLI: plans from a facts snapshot, applies on this machine, bad input exit 3."""

import json
import os
import subprocess
import sys

import pytest

from tests.proxmox.conftest import CONFIGS, DEV511

from gpudoctor.gather.boundary import gather_lxc
from gpudoctor.host.local import LocalHost


def gd(*args):
    return subprocess.run([sys.executable, "-m", "gpudoctor", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def snap(tmp_path):
    """A facts snapshot whose boundary facts were gathered on this machine (the Proxmox host is `localhost`)."""
    (tmp_path / "pve").mkdir()
    conf = tmp_path / "pve/200.conf"
    conf.write_bytes((CONFIGS / "200-seed.conf").read_bytes())
    b = gather_lxc(LocalHost(), 200, config=str(conf), devices=str(DEV511), ask_status=False, stat_nodes=False,
                   read_running=False)
    doc = {"schema": "gpudoctor.snapshot/1", "host": "ct200", "facts": {"schema": "gpudoctor.facts/1", "boundary": b}}
    p = tmp_path / "snap.json"
    p.write_text(json.dumps(doc))
    state = ["--backup-dir", tmp_path / "backups", "--audit-log", tmp_path / "audit.jsonl",
             "--lock-dir", tmp_path / "locks"]
    return p, conf, state


def test_fix_from_snapshot_plans_and_the_live_config_is_applied(snap):
    """A snapshot is planned from, never applied (a replay cannot act: tests/gate/test_replay_acts_on_nothing.py);
    the same change is applied from the live config (`lxc fix --config`), and a second run finds it there."""
    from tests.proxmox.conftest import DEV511

    p, conf, state = snap
    before = conf.read_bytes()
    r = gd("fix", "--facts", p, *state)
    assert r.returncode == 1 and "PLAN  lxc.cgroup_allow on localhost" in r.stdout and conf.read_bytes() == before
    r = gd("fix", "--facts", p, "--only", "lxc.cgroup_allow", "--apply", "--yes", "--json", *state)
    assert r.returncode == 3 and "will not apply fixes from a snapshot of ct200" in r.stderr
    assert conf.read_bytes() == before
    live = ("lxc", "fix", "--config", conf, "--devices", DEV511, "--apply", "--yes")
    r = gd(*live, "--json", *state)
    doc = json.loads(r.stdout)
    assert doc["outcomes"][0]["result"] == "applied" and r.returncode == 1  # restart still pending
    assert b"lxc.cgroup2.devices.allow: c 511:* rwm" in conf.read_bytes()
    r = gd(*live, *state)  # again: the live config already allows it
    assert r.returncode == 0 and r.stdout == "nothing to fix\n"
    assert [json.loads(x)["result"] for x in (p.parent / "audit.jsonl").read_text().splitlines()] == [
        "started", "applied"]  # "started" before the apply (#40: a killed run says so); the refusal wrote nothing


@pytest.mark.parametrize("content,msg", [
    ("{not json", "not valid JSON"),
    ('{"schema": "other/1"}', "not a gpudoctor snapshot"),
    ("[1, 2]", "not a gpudoctor snapshot"),
])
def test_bad_facts_file_is_one_line_exit_3(tmp_path, content, msg):
    p = tmp_path / "f.json"
    p.write_text(content)
    r = gd("fix", "--facts", p)
    assert r.returncode == 3 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith(f"gpudoctor: {p}:")


def test_unknown_remedy_is_bad_input(tmp_path):
    r = gd("fix", "--only", "no.such.remedy", "--facts", os.devnull)
    assert r.returncode == 3 and "unknown remedy no.such.remedy" in r.stderr
