"""model.stage: a real model on disk, its stage into the real /dev/shm tmpfs wiped, restaged through the remedy engine.
Contract: plan → apply → plan is None; a failed verify removes the marker; refusals without a source or room."""

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost
from gpudoctor.model import probe
from gpudoctor.model import stage as st
from gpudoctor.remedies.model_stage import ModelStage
from gpudoctor.remedy import AuditLog, Engine, RemedyContext

from tests.model.modelfiles import shard_name, write_model

NAME = "gpu1"
OTHER_BOOT = "0badb007-0000-4000-8000-000000000000"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUDOCTOR_STATE_DIR", str(tmp_path / "state"))
    src = tmp_path / "disk" / "Qwen3-tiny"
    write_model(src, shards=3, elems=4096)
    dst = Path("/dev/shm") / f"gpudoctor-remedy-test-{uuid.uuid4().hex[:10]}"
    yield src, dst, tmp_path
    shutil.rmtree(dst, ignore_errors=True)


def facts_of(host, dst):
    return gather(host, GatherContext(name=NAME, model_paths=[str(dst)], timeout=20), only={"model", "tools"})


def engine(host, tmp_path, sources=None):
    ctx = RemedyContext(hosts={NAME: host}, timeout=10, options={"model_sources": sources or {}, "stage_jobs": 2})
    return Engine([ModelStage()], ctx, audit_log=AuditLog(str(tmp_path / "audit.jsonl")),
                  lock_dir=str(tmp_path / "locks"))


def wipe_by_reboot(dst, tmp_path):
    """What a reboot leaves: DST gone; the persistent record (outside tmpfs) from the boot before."""
    shutil.rmtree(dst)
    (rec,) = (tmp_path / "state" / "staged").iterdir()
    doc = json.loads(rec.read_text())
    doc["boot_id"] = OTHER_BOOT
    rec.write_text(json.dumps(doc))


def test_a_model_wiped_by_a_reboot_is_restaged_from_the_recorded_source(env):
    src, dst, tmp_path = env
    st.apply_stage(st.plan_stage(str(src), str(dst), check_busy=False))
    wipe_by_reboot(dst, tmp_path)
    host = LocalHost(name=NAME)
    eng = engine(host, tmp_path)
    facts = facts_of(host, dst)
    plan = eng.plan(facts)
    (change,) = plan.changes
    assert change.commands == [f"gpudoctor model stage --from {src} --to {dst} --apply"]
    assert "wiped by a reboot" in change.diff and change.risk == "medium"
    assert not dst.exists()  # dry run
    (out,) = eng.apply(plan)
    assert out.result == "applied", out.detail
    assert probe.verify_model(str(dst))["complete"]
    marker = json.loads((dst / probe.MARKER_NAME).read_text())
    assert marker["boot_id"] == probe.boot_id() and marker["source"] == str(src)
    assert eng.plan(facts_of(host, dst)).changes == []
    again = eng.apply(plan)[0]
    assert again.result == "unchanged" and json.loads((dst / probe.MARKER_NAME).read_text()) == marker


def test_never_staged_needs_a_source(env):
    src, dst, tmp_path = env
    dst.mkdir()
    (dst / "config.json").write_text("{}")  # a skeleton: metadata only
    host = LocalHost(name=NAME)
    plan = engine(host, tmp_path).plan(facts_of(host, dst))
    (ref,) = plan.refusals
    assert f"pass --model-source {dst}=SRC" in ref.reason
    eng = engine(host, tmp_path, sources={str(dst): str(src)})
    (out,) = eng.apply(eng.plan(facts_of(host, dst)))
    assert out.result == "applied", out.detail
    assert probe.verify_model(str(dst))["complete"]


def test_no_room_in_tmpfs_is_refused(env):
    src, dst, tmp_path = env
    st.apply_stage(st.plan_stage(str(src), str(dst), check_busy=False))
    wipe_by_reboot(dst, tmp_path)
    host = LocalHost(name=NAME)
    facts = facts_of(host, dst)
    facts["model"]["paths"][0]["statvfs"]["avail"] = 10  # a full /dev/shm
    (ref,) = engine(host, tmp_path).plan(facts).refusals
    assert "no room to restage" in ref.reason


class ShardLostAfterStage(LocalHost):
    """Something truncates a shard between the stage and the re-check (another writer, a full tmpfs)."""

    def __init__(self, dst, **kw):
        super().__init__(**kw)
        self.dst = dst

    def run(self, argv, timeout=None, input=None, env=None):
        shard = self.dst / shard_name(2, 3)
        if shard.exists() and shard.stat().st_size > 100:
            os.truncate(shard, 100)
        return super().run(argv, timeout=timeout, input=input, env=env)


def test_failed_verify_removes_the_marker(env):
    src, dst, tmp_path = env
    host = ShardLostAfterStage(dst, name=NAME)
    dst.mkdir()
    (dst / "config.json").write_text("{}")
    eng = engine(host, tmp_path, sources={str(dst): str(src)})
    plan = eng.plan(gather(LocalHost(name=NAME), GatherContext(name=NAME, model_paths=[str(dst)], timeout=20),
                           only={"model"}))
    (out,) = eng.apply(plan)
    assert out.result == "rolled_back" and "truncated" in out.verify.summary + " ".join(out.verify.evidence)
    assert not (dst / probe.MARKER_NAME).exists()
