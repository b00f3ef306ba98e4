"""#40 item 3: the unattended restage (the daemon's model.stage remedy, `fix --apply`) takes its source only from the
command line or root's own stage record — never from the staging marker inside the target directory, which any user
may have made first in /dev/shm, nor from a record another user could write."""

from __future__ import annotations

import json
import os

from gpudoctor.model import probe
from tests.hostile.planted import as_attacker, shm_name  # noqa: F401 - fixtures
from tests.model.modelfiles import write_model


def _plant(shm_name, evil_src):
    """A model directory with a skeleton config and a marker that names the attacker's source."""

    def plant():
        shm_name.mkdir(mode=0o755)
        (shm_name / "config.json").write_text("{}")
        (shm_name / probe.MARKER_NAME).write_text(json.dumps({
            "schema": probe.MARKER_SCHEMA, "boot_id": "0badb007-0000-4000-8000-000000000000", "source": str(evil_src),
            "files": [{"name": "model.safetensors", "size": 1 << 20}]}))

    as_attacker(plant)


def _daemon_actions(tmp_path, dst):
    """What the daemon's engine would do on this machine for `dst`: its check, then its plan."""
    from gpudoctor.daemon.engine import EngineConfig, PipelineEngine

    eng = PipelineEngine(EngineConfig(state_dir=str(tmp_path / "daemon"), models=(str(dst),), timeout=30))
    try:
        host = eng.hosts[0]
        return [a for a in eng.plan(host, eng.check(host)) if a.remedy == "model.stage"]
    finally:
        eng.close()


def test_the_daemon_never_restages_from_a_marker_inside_the_target(tmp_path, shm_name, monkeypatch):
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    evil = tmp_path / "evil-src"
    write_model(evil, shards=1, elems=1024)
    _plant(shm_name, evil)
    acts = _daemon_actions(tmp_path, shm_name)
    assert not [a for a in acts if "change" in a.data], acts  # nothing to apply...
    # ...and the daemon says why, once a cycle (it used to drop a refused plan without a word)
    assert [a.data.get("refused", "") for a in acts] and all("marker inside it is not trusted" in a.data["refused"]
                                                             for a in acts), acts


def test_a_record_another_user_can_write_is_not_a_source(tmp_path, shm_name, monkeypatch):
    """The record names the source only while root owns it and nobody else can write it."""
    from gpudoctor.gather import gather
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.host.local import LocalHost
    from gpudoctor.remedies.model_stage import ModelStage
    from gpudoctor.remedy import AuditLog, Engine, RemedyContext

    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    evil = tmp_path / "evil-src"
    write_model(evil, shards=1, elems=1024)
    _plant(shm_name, evil)
    rec = tmp_path / "state" / probe.STATE_SUBDIR / (probe.record_key(str(shm_name)) + ".json")
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"schema": "gpudoctor.stage-record/1", "dst": str(shm_name), "state": "staged",
                               "source": str(evil), "boot_id": "x", "files": []}))
    os.chmod(rec, 0o666)
    host = LocalHost(name="gpu1")
    facts = gather(host, GatherContext(name="gpu1", model_paths=[str(shm_name)], timeout=20), only={"model", "tools"})
    eng = Engine([ModelStage()], RemedyContext(hosts={"gpu1": host}, timeout=10, options={}),
                 audit_log=AuditLog(str(tmp_path / "audit.jsonl")), lock_dir=str(tmp_path / "locks"))
    plan = eng.plan(facts)
    assert plan.changes == []
    (ref,) = plan.refusals
    assert "no stage record names one" in ref.reason and "marker inside it is not trusted" in ref.reason
    os.chmod(rec, 0o644)  # root's own record: now it is the source (and the stage itself refuses nobody's DST)
    plan = eng.plan(gather(host, GatherContext(name="gpu1", model_paths=[str(shm_name)], timeout=20),
                           only={"model", "tools"}))
    assert plan.changes == []  # a trusted source now, but the directory is nobody's: refused at plan
    (ref,) = plan.refusals
    assert "owned by nobody" in ref.reason, ref.reason
    # and apply refuses too (stage's own check), were a plan made before the directory changed hands
    from gpudoctor.remedy import Change, Plan

    change = Change("model.stage", "gpu1", "restage", data={"actions": [{"dst": str(shm_name), "src": str(evil),
                                                                          "need": 0}], "skipped": [], "gpudoctor": None})
    (out,) = eng.apply(Plan(changes=[change]))
    assert out.result != "applied" and "owned by nobody" in out.detail, out.detail
    assert sorted(os.listdir(shm_name)) == sorted(["config.json", probe.MARKER_NAME])
