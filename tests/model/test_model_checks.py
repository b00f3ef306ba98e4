"""workload.model.* checks on facts built by the real gather (LocalHost, fake-root trees and the real /dev/shm)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import capture, make_root
from gpudoctor.checks import workload_model as wm
from gpudoctor.errors import RemedyError
from gpudoctor.findings import Status
from gpudoctor.gather.model import gather
from gpudoctor.host.local import LocalHost
from gpudoctor.model import probe
from gpudoctor.model import stage as st
from .modelfiles import shard_name, write_model

REAL_BOOT = open("/proc/sys/kernel/random/boot_id").read().strip()
OTHER_BOOT = "0badb007-0000-4000-8000-000000000000"
DST = "/dev/shm/Qwen3-tiny"
H200_MOUNTS = capture("h200-healthy-mounts.txt")


@dataclass
class Ctx:
    model_paths: list = field(default_factory=list)
    timeout: float = 20.0


def diagnose(host, paths):
    facts = {"model": gather(host, Ctx(list(paths)))}
    out = {}
    for fn in (wm.check_complete, wm.check_staged_this_boot, wm.check_tmpfs_room, wm.check_memory_cgroup,
               wm.check_location):
        for f in fn(facts) or []:
            out[(f.id.rsplit(".", 1)[1], f.subject)] = f
    return facts, out


def stage_into_root(root: Path, src: Path, state_dir: Path, rel: str = DST) -> dict:
    """A real stage into ROOT+rel; its persistent record is filed under the host-side path `rel`."""
    plan = st.plan_stage(str(src), str(root) + rel, check_busy=False)
    try:
        st.apply_stage(plan)
    finally:
        move_record(root, state_dir, rel)
    return plan


def move_record(root, state_dir, rel):
    real = state_dir / "staged" / (probe.record_key(str(root) + rel) + ".json")
    if real.exists():
        rec = json.loads(real.read_text())
        rec["dst"] = rel
        (state_dir / "staged" / (probe.record_key(rel) + ".json")).write_text(json.dumps(rec))
        real.unlink()


@pytest.fixture
def h200(tmp_path):
    """A fake root with the H200's captured /proc/mounts (tmpfs /dev/shm, mounted twice) and cgroup."""
    root = make_root(tmp_path / "root", mounts=H200_MOUNTS, cgroup=capture("h200-healthy-proc-cgroup.txt"),
                     boot_id=REAL_BOOT)
    (root / "dev/shm").mkdir(parents=True)
    write_model(tmp_path / "src", shards=3, elems=5000)
    return root


def set_boot(root, boot):
    (root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")


def test_staged_this_boot_all_ok(h200, tmp_path, state_dir):
    stage_into_root(h200, tmp_path / "src", state_dir)
    facts, f = diagnose(LocalHost(root=str(h200)), [DST])
    assert f["complete", DST].status == Status.OK
    assert f["staged_this_boot", DST].status == Status.OK
    assert f["tmpfs_room", DST].status == Status.OK
    assert f["location", DST].status == Status.INFO and "tmpfs /dev/shm" in f["location", DST].summary
    # the captured VM has no memory limit above init.scope
    assert f["memory_cgroup", DST].status == Status.OK and "no memory limit" in f["memory_cgroup", DST].summary
    p = facts["model"]["paths"][0]
    assert p["mount"]["options"].endswith("size=134217728k")  # the later of the two /dev/shm mounts
    assert p["verify"]["marker"]["boot_id"] == REAL_BOOT and p["record"]["state"] == "staged"


@pytest.mark.parametrize("leftover", ["nothing", "skeleton"])
def test_wiped_by_reboot_is_told_apart(h200, tmp_path, state_dir, leftover):
    stage_into_root(h200, tmp_path / "src", state_dir)
    set_boot(h200, OTHER_BOOT)  # the reboot: a new boot id, and tmpfs lost its pages
    d = Path(str(h200) + DST)
    if leftover == "nothing":
        shutil.rmtree(d)
    else:  # the directory skeleton and metadata survived, the weights and marker did not
        for n in os.listdir(d):
            if n.endswith(".safetensors") or n == probe.MARKER_NAME:
                os.unlink(d / n)
    _, f = diagnose(LocalHost(root=str(h200)), [DST])
    s = f["staged_this_boot", DST]
    assert s.status == Status.FAIL and "wiped by a reboot" in s.summary
    assert f"this is boot {OTHER_BOOT[:8]}" in s.summary and REAL_BOOT[:8] in s.summary
    assert f"gpudoctor model stage --from {tmp_path / 'src'} --to {DST} --apply" == s.hint
    c = f["complete", DST]
    assert c.status == Status.FAIL
    if leftover == "nothing":
        assert "does not exist" in c.summary
    else:
        assert "3 missing" in c.summary and "metadata only" in c.summary
        assert any(shard_name(1, 3) in e and "expected" in e and "bytes" in e for e in c.evidence)
    assert f["tmpfs_room", DST].status == Status.OK and "room to restage" in f["tmpfs_room", DST].summary


def test_wiped_without_reboot(h200, tmp_path, state_dir):
    stage_into_root(h200, tmp_path / "src", state_dir)
    shutil.rmtree(str(h200) + DST)  # a container restart: new /dev/shm, same kernel boot id
    _, f = diagnose(LocalHost(root=str(h200)), [DST])
    s = f["staged_this_boot", DST]
    assert s.status == Status.FAIL and "this boot, but the marker and files are gone" in s.summary


def test_never_staged_and_staged_by_hand(h200, tmp_path, state_dir):
    _, f = diagnose(LocalHost(root=str(h200)), [DST])
    assert f["staged_this_boot", DST].status == Status.FAIL
    assert "never staged" in f["staged_this_boot", DST].summary
    assert f["tmpfs_room", DST].status == Status.UNKNOWN  # nothing says how big the model is
    shutil.copytree(tmp_path / "src", str(h200) + DST)  # cp -r by hand
    _, f = diagnose(LocalHost(root=str(h200)), [DST])
    assert f["complete", DST].status == Status.OK
    assert f["staged_this_boot", DST].status == Status.INFO and "not staged by gpudoctor" in \
        f["staged_this_boot", DST].summary


def test_marker_removed_from_a_complete_stage_warns(h200, tmp_path, state_dir):
    stage_into_root(h200, tmp_path / "src", state_dir)
    os.unlink(str(h200) + DST + "/" + probe.MARKER_NAME)
    _, f = diagnose(LocalHost(root=str(h200)), [DST])
    assert f["staged_this_boot", DST].status == Status.WARN


def test_interrupted_stage(h200, tmp_path, state_dir):
    plan = st.plan_stage(str(tmp_path / "src"), str(h200) + DST, check_busy=False)
    os.unlink(tmp_path / "src" / shard_name(2, 3))  # the source vanishes mid-stage
    with pytest.raises(RemedyError):
        st.apply_stage(plan)
    move_record(h200, state_dir, DST)
    _, f = diagnose(LocalHost(root=str(h200)), [DST])
    s = f["staged_this_boot", DST]
    assert s.status == Status.FAIL and "did not finish (interrupted)" in s.summary
    assert f["complete", DST].status == Status.FAIL


def test_not_on_tmpfs(tmp_path, state_dir):
    root = make_root(tmp_path / "root", mounts="/dev/vda / ext4 rw,relatime 0 0\n")
    write_model(root / "data/models/m", shards=2)
    _, f = diagnose(LocalHost(root=str(root)), ["/data/models/m"])
    assert f["complete", "/data/models/m"].status == Status.OK
    assert ("staged_this_boot", "/data/models/m") not in f and ("tmpfs_room", "/data/models/m") not in f
    assert "ext4 /, not tmpfs" in f["location", "/data/models/m"].summary


def test_no_room_for_what_the_index_says_is_missing(h200, tmp_path, state_dir):
    d = Path(str(h200) + DST)
    write_model(d, shards=2)
    idx = d / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["metadata"]["total_size"] = 10 ** 15  # a petabyte model: no tmpfs holds that
    idx.write_text(json.dumps(data))
    os.unlink(d / shard_name(2, 2))
    _, f = diagnose(LocalHost(root=str(h200)), [DST])
    r = f["tmpfs_room", DST]
    assert r.status == Status.FAIL and "no room to restage" in r.summary and "MemAvailable" in r.summary


def _cgroup_root(tmp_path, limit, current, inactive=0, model_shards=3, elems=5000, version=2):
    if version == 2:
        files = {"sys/fs/cgroup/lxc/200/memory.max": f"{limit}\n",
                 "sys/fs/cgroup/lxc/200/memory.current": f"{current}\n",
                 "sys/fs/cgroup/lxc/200/memory.stat": f"anon 1\ninactive_file {inactive}\nshmem 0\n",
                 "sys/fs/cgroup/lxc/200/ns/memory.max": "max\n", "sys/fs/cgroup/lxc/200/ns/memory.current": "4096\n"}
        mounts = "tmpfs /dev/shm tmpfs rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"
        cgroup = "0::/lxc/200/ns\n"
    else:
        files = {"sys/fs/cgroup/memory/memory.limit_in_bytes": f"{limit}\n",
                 "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{current}\n",
                 "sys/fs/cgroup/memory/memory.stat": f"cache 5\ntotal_inactive_file {inactive}\n"}
        mounts = "tmpfs /dev/shm tmpfs rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"
        cgroup = "4:memory:/process_api/c311\n1:cpu:/\n"
    root = make_root(tmp_path / "root", mounts=mounts, cgroup=cgroup, cgroup_files=files)
    write_model(root / "dev/shm/m", shards=model_shards, elems=elems)
    return root


def test_cgroup_headroom_too_small_to_restage(tmp_path, state_dir):
    root = _cgroup_root(tmp_path, limit=1 << 20, current=1 << 20, inactive=4096, elems=50_000)
    os.unlink(root / "dev/shm/m" / shard_name(3, 3))
    facts, f = diagnose(LocalHost(root=str(root)), ["/dev/shm/m"])
    cg = facts["model"]["cgroup"]
    assert cg["version"] == 2 and [lv["dir"] for lv in cg["levels"]] == ["/sys/fs/cgroup/lxc/200/ns",
                                                                         "/sys/fs/cgroup/lxc/200"]
    assert cg["headroom"] == 4096 and cg["limit"] == 1 << 20
    m = f["memory_cgroup", "/dev/shm/m"]
    assert m.status == Status.FAIL and "would exceed the memory cgroup" in m.summary
    assert any("memory.max = 1048576" in e for e in m.evidence)


def test_cgroup_model_takes_most_of_the_limit(tmp_path, state_dir):
    root = _cgroup_root(tmp_path, limit=700_000, current=650_000, elems=100_000)
    _, f = diagnose(LocalHost(root=str(root)), ["/dev/shm/m"])
    m = f["memory_cgroup", "/dev/shm/m"]
    assert m.status == Status.WARN and "of the memory limit" in m.summary


def test_cgroup_v1_and_unlimited(tmp_path, state_dir):
    root = _cgroup_root(tmp_path, limit=9223372036854771712, current=5 << 20, version=1)
    facts, f = diagnose(LocalHost(root=str(root)), ["/dev/shm/m"])
    cg = facts["model"]["cgroup"]
    assert cg["version"] == 1 and "not visible" in cg["note"] and cg["limit"] is None
    assert f["memory_cgroup", "/dev/shm/m"].status == Status.OK


def test_cgroup_v1_limited(tmp_path, state_dir):
    root = _cgroup_root(tmp_path, limit=8 << 30, current=1 << 30, inactive=1 << 29, version=1)
    facts, f = diagnose(LocalHost(root=str(root)), ["/dev/shm/m"])
    assert facts["model"]["cgroup"]["headroom"] == (8 << 30) - (1 << 29)
    m = f["memory_cgroup", "/dev/shm/m"]
    assert m.status == Status.OK and any("memory.limit_in_bytes = 8589934592" in e for e in m.evidence)


def test_probe_that_cannot_run_is_unknown_not_healthy(tmp_path):
    host = LocalHost(python=[str(tmp_path / "no-python3")])
    facts, f = diagnose(host, ["/dev/shm/x"])
    assert facts["model"]["error"] and "exited 127" in facts["model"]["error"]
    assert f["complete", "/dev/shm/x"].status == Status.UNKNOWN
    assert f["staged_this_boot", "/dev/shm/x"].status == Status.UNKNOWN


def test_probe_that_hangs_is_unknown(tmp_path):
    host = LocalHost(python=[sys.executable, "-c", "import time; time.sleep(30)", "--"])
    facts = {"model": gather(host, Ctx(["/dev/shm/x"], timeout=0.5))}
    assert "did not answer in 0.5 s" in facts["model"]["error"]
    (f,) = wm.check_complete(facts)
    assert f.status == Status.UNKNOWN and "did not answer" in f.summary


def test_no_model_paths_means_no_findings():
    facts = {"model": gather(LocalHost(), Ctx([]))}
    assert facts["model"]["paths"] == []
    assert all(fn(facts) is None for fn in (wm.check_complete, wm.check_staged_this_boot, wm.check_tmpfs_room,
                                            wm.check_memory_cgroup, wm.check_location))


def test_real_paths_end_to_end(tmp_path, shm_dir, state_dir):
    """No fake root: stage into the real /dev/shm, gather this machine, then wipe it."""
    write_model(tmp_path / "src", shards=2)
    st.apply_stage(st.plan_stage(str(tmp_path / "src"), str(shm_dir)))
    _, f = diagnose(LocalHost(), [str(shm_dir)])
    assert f["complete", str(shm_dir)].status == Status.OK
    assert f["staged_this_boot", str(shm_dir)].status == Status.OK
    assert f["location", str(shm_dir)].data["fstype"] == "tmpfs"
    shutil.rmtree(shm_dir)
    _, f = diagnose(LocalHost(), [str(shm_dir)])
    assert f["complete", str(shm_dir)].status == Status.FAIL
    assert "the marker and files are gone" in f["staged_this_boot", str(shm_dir)].summary


def test_mount_table_rules():
    mounts = probe.parse_mounts(capture("h200-uvmtools-000-mounts.txt"))
    assert probe.mount_of("/dev/shm/m", mounts)["options"].endswith("size=67108864k")  # the last /dev/shm wins
    assert probe.mount_of("/dev/shm", mounts)["fstype"] == "tmpfs"
    assert probe.mount_of("/devices/x", mounts)["mountpoint"] == "/"  # a name prefix is not a path prefix
    assert probe.mount_of("/usr/local/nvidia/lib", mounts)["fstype"] == "squashfs"
    df = capture("h200-uvmtools-000-df-shm.txt")
    assert "/dev/shm" in df  # the same capture's df agrees: a 64 GiB tmpfs (67108864k)
    esc = probe.parse_mounts("tmpfs /mnt/my\\040models tmpfs rw 0 0\n/dev/sda1 / ext4 rw 0 0\n")
    assert probe.mount_of("/mnt/my models/q", esc)["fstype"] == "tmpfs"


def test_gather_over_real_ssh_matches_local(ssh_fake_root, tmp_path, state_dir):
    """The probe program runs on the target through the Host API: over SSH it sees what LocalHost sees."""
    root = ssh_fake_root.root
    make_root(root, mounts=H200_MOUNTS, boot_id=REAL_BOOT)
    write_model(root / DST.lstrip("/"), shards=3)
    os.unlink(root / DST.lstrip("/") / shard_name(2, 3))
    remote, _ = diagnose(ssh_fake_root.host, [DST, "/dev/shm/absent"])
    local, _ = diagnose(LocalHost(root=str(root)), [DST, "/dev/shm/absent"])
    assert remote["model"]["error"] is None, remote["model"]["error"]
    for key in ("boot_id", "meminfo"):
        assert remote["model"][key] == local["model"][key]
    for rp, lp in zip(remote["model"]["paths"], local["model"]["paths"]):
        for key in ("path", "exists", "mount"):
            assert rp[key] == lp[key]
        for key in ("kind", "complete", "problems", "files", "weights"):
            assert rp["verify"][key] == lp["verify"][key]
    assert [p["kind"] for p in remote["model"]["paths"][0]["verify"]["problems"]] == ["missing"]


def test_probe_program_fits_one_argv_string():
    """Linux caps one argument at 128 KiB (MAX_ARG_STRLEN); the probe travels as `python3 -c SOURCE`."""
    from gpudoctor.gather.model import _source

    assert len(_source().encode()) < 100_000
    assert "import gpudoctor" not in _source() and "from gpudoctor" not in _source()  # stdlib only on the target
