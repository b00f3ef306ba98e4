"""#24 item 6 and #23's paper cut: a printed remedy line carries the scope it was found in (--host, --unit, --model,
--inventory, --only), so the line copied as printed acts on the same thing; `check --snapshot` says how to act on the
live host (fix cannot change a snapshot).

Every check that declares a remedy (the registry, walked) is rendered as a root cause in each scope; its remedy line
is parsed by the real `gpudoctor fix` command's own parser, whose options must be exactly the scope. The real CLI
renders two committed snapshots.
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from gpudoctor.term import Styled

from gpudoctor.checkreg import all_checks
from gpudoctor.commands.fix import fix as fix_command, select_remedies
from gpudoctor.diagnose import Diagnosis
from gpudoctor.findings import Finding, Status
from gpudoctor.report import Scope, remedy_command, render

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SCOPES = {
    "this machine": Scope(),
    "--host": Scope(host="ct200"),
    "--unit": Scope(units=("sglang.service",)),
    "--host --unit": Scope(host="gpu-07", units=("sglang.service", "vllm@a.service")),
    "--inventory --host": Scope(host="ct200", inventory="/etc/gpudoctor/my inventory.yaml"),
    "--model": Scope(models=("/dev/shm/models/Qwen3 32B",)),
    "snapshot": Scope(snapshot_of="gpu1", units=("sglang.service",)),
}
REMEDIED = [c for c in all_checks() if c.remedy]


def _remedy_lines(d: Diagnosis, scope: Scope, width: int = 100) -> list[str]:
    buf = io.StringIO()
    render(d, Styled(buf, width=width, color=False), scope=scope)
    return [ln.strip() for ln in buf.getvalue().splitlines() if ln.strip().startswith("remedy:")]


def _parsed(line: str) -> dict:
    """The remedy line's command as the real `gpudoctor fix` parses it."""
    cmd = line[len("remedy: "):].split("   (", 1)[0]
    argv = shlex.split(cmd)
    assert argv[:2] == ["gpudoctor", "fix"], line
    ctx = fix_command.make_context("fix", argv[2:])
    return ctx.params


def test_the_registry_has_remedies_to_walk():
    assert len(REMEDIED) >= 8 and {"systemd.device_allow", "devices.node.create"} <= {c.remedy for c in REMEDIED}


@pytest.mark.parametrize("scope_name", list(SCOPES))
@pytest.mark.parametrize("spec", REMEDIED, ids=lambda c: c.id)
def test_every_remedy_line_copied_acts_on_the_same_scope(spec, scope_name):
    scope = SCOPES[scope_name]
    f = Finding(spec.id, Status.FAIL, f"{spec.id} fails", layer=spec.layer, subject="/dev/x", remedy=spec.remedy)
    [line] = _remedy_lines(Diagnosis("gpu1", [f], [f], [f.key]), scope, width=60)  # one line, however narrow
    p = _parsed(line)
    assert p["only"] == (spec.remedy,)
    assert p["host_name"] == scope.host and p["inventory"] == scope.inventory
    assert p["units"] == scope.units and p["models"] == scope.models
    assert not p["apply"] and p["facts_path"] is None  # a dry run, of the live host
    assert [r.id for r in select_remedies(p["only"])] == [spec.remedy]  # the id is one this build applies
    if scope.snapshot_of:
        assert f"run it on {scope.snapshot_of}, the live host of this snapshot: a snapshot cannot be fixed" in line
    else:
        assert "dry run: shows the diff" in line


def test_values_are_quoted_for_the_shell():
    cmd = remedy_command("model.stage", Scope(models=("/dev/shm/a b; rm -rf x",)))
    assert shlex.split(cmd)[-3:] == ["/dev/shm/a b; rm -rf x", "--only", "model.stage"]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent)


def test_check_snapshot_of_a_unit_says_where_to_act_with_its_unit():
    r = _cli("check", "--snapshot", str(SNAPSHOTS / "systemd-sglang-uvm-510.json"))
    assert r.returncode == 2, r.stderr
    [line] = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("remedy:")]
    p = _parsed(line)
    assert p["units"] == ("sglang.service",) and p["only"] == ("systemd.device_allow",) and p["host_name"] is None
    assert "run it on gpu1, the live host of this snapshot" in line
    doc = json.loads((SNAPSHOTS / "systemd-sglang-uvm-510.json").read_text())
    assert doc["host"] == "gpu1" and doc["context"]["units"] == ["sglang.service"]


def test_check_snapshot_never_offers_a_command_for_the_snapshot():
    r = _cli("check", "--snapshot", str(EXAMPLES / "h200-uvmtools-000.json"))
    [line] = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("remedy:")]
    assert "--snapshot" not in line.split("   (")[0] and "--facts" not in line
    assert _parsed(line)["only"] == ("devices.node.mode",) and "run it on vm, the live host of this snapshot" in line


def test_check_prints_no_remedy_line_that_fix_refuses():
    """#41 item 5: on the README's real H200 capture fix refuses devices.node.create (a bind mount); check said
    `remedy: gpudoctor fix --only devices.node.create`. It now prints fix's own refusal, word for word."""
    r = _cli("check", "--snapshot", str(EXAMPLES / "h200-uvm-blocked.json"))
    assert not [ln for ln in r.stdout.splitlines() if ln.strip().startswith("remedy:")], r.stdout
    fx = _cli("fix", "--facts", str(EXAMPLES / "h200-uvm-blocked.json"))
    [refusal] = [ln for ln in fx.stdout.splitlines() if ln.startswith("REFUSED  devices.node.create: ")]
    why = refusal.split(": ", 1)[1]
    assert "is a bind mount" in why
    assert f"    no remedy here: `gpudoctor fix --only devices.node.create` refuses: {why}" in r.stdout.splitlines()
