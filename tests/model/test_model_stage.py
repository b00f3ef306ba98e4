"""`gpudoctor model stage`: real copies into the real /dev/shm tmpfs, refusals, resume, HF caches, marker."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from gpudoctor.errors import LockHeld, RemedyError
from gpudoctor.model import probe
from gpudoctor.model import stage as st
from .modelfiles import safetensors_bytes, shard_name, write_hf_cache, write_model


def tree(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, d)] = open(p, "rb").read()
    return out


def boot_id():
    return open("/proc/sys/kernel/random/boot_id").read().strip()


def test_dry_run_changes_nothing(cli, tmp_path, shm_dir, state_dir):
    write_model(tmp_path / "m", shards=3)
    r = cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir)
    assert r.code == 1, r.err  # a copy is planned: 1, as `fix`'s dry run (#41)
    assert "tmpfs /dev/shm" in r.out and "copy      7 file(s)" in r.out and "dry run: nothing changed" in r.out
    assert not shm_dir.exists() and not state_dir.exists()


def test_apply_copies_verifies_and_marks(cli, tmp_path, shm_dir, state_dir):
    files = write_model(tmp_path / "m", shards=3, elems=300_000)
    r = cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--apply", "--jobs", "3")
    assert r.code == 0, r.err
    assert "STAGED: copied" in r.out
    got = tree(shm_dir)
    marker = json.loads(got.pop(probe.MARKER_NAME))
    got.pop(probe.LOCK_NAME)
    assert got == files
    assert marker["boot_id"] == boot_id() and marker["source"] == str(tmp_path / "m")
    assert {f["name"]: f["size"] for f in marker["files"]} == {n: len(b) for n, b in files.items()}
    assert marker["total_bytes"] == sum(len(b) for b in files.values())
    (rec,) = list((state_dir / "staged").iterdir())
    rec = json.loads(rec.read_text())
    assert (rec["state"], rec["dst"], rec["boot_id"]) == ("staged", str(shm_dir), boot_id())
    for name, data in files.items():  # mode and mtime kept
        s, d = os.stat(tmp_path / "m" / name), os.stat(shm_dir / name)
        assert (s.st_mode, s.st_mtime_ns) == (d.st_mode, d.st_mtime_ns)
    assert cli("model", "verify", shm_dir).code == 0


def test_rerun_skips_whole_shards_and_replaces_other_revisions(tmp_path, shm_dir, state_dir):
    write_model(tmp_path / "m", shards=4, elems=1000)
    st.apply_stage(st.plan_stage(str(tmp_path / "m"), str(shm_dir)))
    plan = st.plan_stage(str(tmp_path / "m"), str(shm_dir))
    assert plan.nothing_to_copy and plan.to_copy == 0
    # a different revision of shard 2 (same size, other tensors), shard 3 truncated, shard 4 gone
    (shm_dir / shard_name(2, 4)).write_bytes(safetensors_bytes({"layers.9.w0": ("BF16", (1000,)),
                                                                "layers.9.w1": ("BF16", (1000,))},
                                                               metadata={"format": "pt"}))
    assert os.path.getsize(shm_dir / shard_name(2, 4)) == os.path.getsize(tmp_path / "m" / shard_name(2, 4))
    with open(shm_dir / shard_name(3, 4), "r+b") as fh:
        fh.truncate(100)
    os.unlink(shm_dir / shard_name(4, 4))
    plan = st.plan_stage(str(tmp_path / "m"), str(shm_dir))
    acts = {f.name: f.action for f in plan.files}
    assert acts[shard_name(1, 4)] == "skip"
    assert [acts[shard_name(i, 4)] for i in (2, 3, 4)] == ["copy"] * 3
    assert acts["config.json"] == acts["model.safetensors.index.json"] == "copy"  # rewritten last
    assert acts["tokenizer.json"] == "skip"
    progress = []
    res = st.apply_stage(plan, jobs=2, on_progress=progress.append)
    assert sum(progress) == res["copied_bytes"] == plan.to_copy
    assert res["skipped"] == sum(a == "skip" for a in acts.values())
    t = tree(shm_dir)
    for name, data in tree(tmp_path / "m").items():
        assert t[name] == data


def test_hf_cache_source_becomes_plain_files_with_hashes(cli, tmp_path, shm_dir, state_dir):
    folder, blobs = write_hf_cache(tmp_path / "hub", shards=3)
    r = cli("model", "stage", "--from", folder, "--to", shm_dir, "--apply")
    assert r.code == 0, r.err
    assert "@aaaaaaaaaaaa" in r.out
    for name in blobs:
        assert not os.path.islink(shm_dir / name)
        assert (shm_dir / name).read_bytes() == (folder / "blobs" / blobs[name]).read_bytes()
    marker = json.loads((shm_dir / probe.MARKER_NAME).read_text())
    assert marker["revision"] == "a" * 40 and marker["source_kind"] == "hf_repo"
    sha = {f["name"]: f.get("sha256") for f in marker["files"]}
    assert sha[shard_name(1, 3)] == blobs[shard_name(1, 3)] and sha["config.json"] is None
    assert cli("model", "verify", "--hash", shm_dir).code == 0
    p = shm_dir / shard_name(3, 3)
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))
    r = cli("model", "verify", "--hash", shm_dir)
    assert r.code == 2 and "hash_mismatch" in r.out and shard_name(3, 3) in r.out


def test_refuses_an_incomplete_source(cli, tmp_path, shm_dir, state_dir):
    folder, blobs = write_hf_cache(tmp_path / "hub", shards=2)
    (folder / "blobs" / ("e" * 64 + ".incomplete")).write_bytes(b"x")
    r = cli("model", "stage", "--from", folder, "--to", shm_dir, "--apply")
    assert r.code == 2 and "REFUSED: the source is incomplete: incomplete_blob" in r.err
    assert "None" not in r.err and "(expected ? bytes, actual 1)" in r.err, r.err  # #41: was "expected None bytes"
    assert not shm_dir.exists()


def test_refuses_when_tmpfs_lacks_room(cli, tmp_path, shm_dir, state_dir):
    avail = probe.statvfs("/dev/shm")["avail"]
    m = tmp_path / "m"
    write_model(m, shards=1)
    big = avail + (1 << 30)  # a sparse shard one GiB larger than /dev/shm has free
    header = json.dumps({"layers.1.w0": {"dtype": "U8", "shape": [big], "data_offsets": [0, big]},
                         "layers.1.w1": {"dtype": "U8", "shape": [0], "data_offsets": [big, big]}}).encode()
    with open(m / shard_name(1, 1), "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(8 + len(header) + big)
    assert probe.verify_model(str(m))["complete"]
    r = cli("model", "stage", "--from", m, "--to", shm_dir, "--apply")
    assert r.code == 2
    assert "/dev/shm has" in r.err and "available, the stage needs" in r.err
    assert not shm_dir.exists()


def test_refuses_while_a_process_holds_files_open_or_mapped(cli, tmp_path, shm_dir, state_dir):
    write_model(tmp_path / "m", shards=2)
    st.apply_stage(st.plan_stage(str(tmp_path / "m"), str(shm_dir)))
    os.unlink(shm_dir / shard_name(2, 2))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import mmap, sys, time\n"
        "f = open(sys.argv[1], 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); f.close()\n"
        "g = open(sys.argv[2], 'rb')\n"
        "print('ready', flush=True); time.sleep(60)\n"), str(shm_dir / shard_name(1, 2)), str(shm_dir / "config.json")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        r = cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--apply")
        assert r.code == 2
        assert f"REFUSED: pid {holder.pid} (python" in r.err
        assert shard_name(1, 2) in r.err and "config.json" in r.err  # mapped-only and open both count
        assert not (shm_dir / shard_name(2, 2)).exists()
    finally:
        holder.kill()
        holder.wait()
    assert cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--apply").code == 0


def test_lock_held_by_another_stage(tmp_path, shm_dir, state_dir):
    write_model(tmp_path / "m", shards=2)
    shm_dir.mkdir()
    fd = os.open(shm_dir / probe.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        plan = st.plan_stage(str(tmp_path / "m"), str(shm_dir), check_busy=False)
        with pytest.raises(LockHeld):
            st.apply_stage(plan)
        assert sorted(os.listdir(shm_dir)) == [probe.LOCK_NAME]
    finally:
        os.close(fd)


@pytest.mark.parametrize("method", ["rw", "sendfile", "copy_file_range"])
def test_every_copy_method_is_byte_exact(tmp_path, state_dir, monkeypatch, method):
    # disk -> disk so that copy_file_range is allowed; small chunks so files are split across threads
    monkeypatch.setenv("GPUDOCTOR_TEST_STAGE_CHUNK", "65536")
    files = write_model(tmp_path / "m", shards=3, elems=200_003)
    res = st.apply_stage(st.plan_stage(str(tmp_path / "m"), str(tmp_path / "dst")), jobs=4, method=method)
    assert res["method"] == method
    t = tree(tmp_path / "dst")
    assert all(t[n] == b for n, b in files.items())
    assert not [n for n in t if n.endswith(probe.PART_SUFFIX)]


def test_auto_falls_back_across_filesystems(tmp_path, shm_dir, state_dir):
    files = write_model(tmp_path / "m", shards=2, elems=10_000)
    res = st.apply_stage(st.plan_stage(str(tmp_path / "m"), str(shm_dir)), method="auto")
    assert res["method"] in ("copy_file_range", "sendfile")  # same-fs copy_file_range, else sendfile
    assert all((shm_dir / n).read_bytes() == b for n, b in files.items())


def test_disk_destination_is_noted_and_extra_files_left_alone(tmp_path, disk_dir, state_dir):
    write_model(tmp_path / "m", shards=2)
    (disk_dir / "d").mkdir()
    (disk_dir / "d" / "README.local").write_text("mine")
    plan = st.plan_stage(str(tmp_path / "m"), str(disk_dir / "d"))
    assert any("not tmpfs" in n for n in plan.notes) and plan.extra == ["README.local"]
    st.apply_stage(plan)
    assert (disk_dir / "d" / "README.local").read_text() == "mine"


def test_failed_copy_leaves_no_part_files_and_no_marker(tmp_path, shm_dir, state_dir):
    files = write_model(tmp_path / "m", shards=3, elems=50_000)
    plan = st.plan_stage(str(tmp_path / "m"), str(shm_dir))
    os.unlink(tmp_path / "m" / shard_name(2, 3))  # the source vanishes between plan and apply
    with pytest.raises(RemedyError, match="copy failed"):
        st.apply_stage(plan, jobs=2)
    left = os.listdir(shm_dir)
    assert probe.MARKER_NAME not in left and "config.json" not in left
    assert not [n for n in left if n.endswith(probe.PART_SUFFIX)]
    assert not probe.verify_model(str(shm_dir))["complete"]
    (tmp_path / "m" / shard_name(2, 3)).write_bytes(files[shard_name(2, 3)])
    os.utime(tmp_path / "m" / shard_name(2, 3))
    st.apply_stage(st.plan_stage(str(tmp_path / "m"), str(shm_dir)))
    assert probe.verify_model(str(shm_dir))["complete"]


@pytest.mark.parametrize("method", ["auto", "rw"])  # auto: sendfile from disk into tmpfs
def test_a_source_that_fails_after_its_copy_began_leaves_no_part_file(tmp_path, shm_dir, state_dir, monkeypatch,
                                                                       method):
    """The source opens, its first bytes are copied into `.NAME.gpudoctor-part`, then it ends early (truncated
    between plan and apply): the failure cleanup must remove that part file (#35, M2: the open-fails case above
    never makes one)."""
    write_model(tmp_path / "m", shards=2, elems=200_000)
    plan = st.plan_stage(str(tmp_path / "m"), str(shm_dir))
    victim = tmp_path / "m" / shard_name(1, 2)
    size = victim.stat().st_size
    os.truncate(victim, size // 2)  # more than one chunk is still there: the copy really starts
    monkeypatch.setenv("GPUDOCTOR_TEST_STAGE_CHUNK", str(64 * 1024))
    with pytest.raises(RemedyError, match="copy failed: source shrank while copying"):
        st.apply_stage(plan, jobs=2, method=method)
    left = [os.path.join(r, n) for r, _, names in os.walk(shm_dir) for n in names]
    assert not [p for p in left if p.endswith(probe.PART_SUFFIX)], left
    assert not os.path.exists(shm_dir / shard_name(1, 2)) and probe.MARKER_NAME not in os.listdir(shm_dir)


def test_json_plan_and_result(cli, tmp_path, shm_dir, state_dir):
    write_model(tmp_path / "m", shards=2)
    plan = json.loads(cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--json").out)["plan"]
    assert plan["tmpfs"] is True and plan["refusals"] == [] and plan["to_copy"] > 0
    out = json.loads(cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--json", "--apply").out)
    assert out["result"]["verify"]["complete"] is True and out["result"]["boot_id"] == boot_id()
    t0 = time.time()
    again = json.loads(cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--json", "--apply").out)
    assert again["result"]["copied_bytes"] == 0 and time.time() - t0 < 5
    digest = hashlib.sha256((shm_dir / "config.json").read_bytes()).hexdigest()
    assert digest == hashlib.sha256((tmp_path / "m" / "config.json").read_bytes()).hexdigest()


def test_verify_after_a_wipe_uses_the_stage_record(cli, tmp_path, shm_dir, state_dir):
    files = write_model(tmp_path / "m", shards=2)
    assert cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--apply").code == 0
    shutil.rmtree(shm_dir)  # what a reboot does to tmpfs
    r = cli("model", "verify", shm_dir)
    assert r.code == 2 and "directory MISSING" in r.out and "wiped" in r.out
    assert f"staged here from {tmp_path / 'm'} in this boot" in r.out
    shm_dir.mkdir()  # the skeleton comes back (a start script), weights do not
    for n in ("config.json", "model.safetensors.index.json"):
        (shm_dir / n).write_bytes(files[n])
    rep = json.loads(cli("model", "verify", "--json", shm_dir).out)
    missing = {p["file"]: p["expected"] for p in rep["problems"] if p["kind"] == "missing"}
    assert missing == {shard_name(i, 2): len(files[shard_name(i, 2)]) for i in (1, 2)}  # sizes from the record
    for p in (state_dir / "staged").iterdir():
        p.unlink()
    shutil.rmtree(shm_dir)
    assert cli("model", "verify", shm_dir).code == 3  # never staged here: a wrong path is bad input


def test_exclude_and_the_original_folder_note(cli, tmp_path, shm_dir, state_dir):
    write_model(tmp_path / "m", shards=2)
    (tmp_path / "m" / "original").mkdir()
    (tmp_path / "m" / "original" / "consolidated.00.pth").write_bytes(b"w" * 1000)
    plan = st.plan_stage(str(tmp_path / "m"), str(shm_dir))
    assert any("--exclude 'original/*'" in n for n in plan.notes)
    r = cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--exclude", "original/*", "--apply")
    assert r.code == 0 and "excluded 1 file(s)" in r.out
    assert not (shm_dir / "original").exists()
    marker = json.loads((shm_dir / probe.MARKER_NAME).read_text())
    assert "original/consolidated.00.pth" not in {f["name"] for f in marker["files"]}
    assert cli("model", "verify", shm_dir).code == 0


def test_a_process_scan_past_its_deadline_refuses(tmp_path, shm_dir, state_dir, monkeypatch):
    write_model(tmp_path / "m", shards=2)
    shm_dir.mkdir()
    (shm_dir / "stale.txt").write_text("x")  # DST exists: the scan runs
    monkeypatch.setattr(st, "BUSY_SCAN_S", 0.0)  # nothing finishes scanning /proc in no time
    plan = st.plan_stage(str(tmp_path / "m"), str(shm_dir))
    assert plan.busy and plan.busy[0]["stuck"]
    assert any("could not tell whether processes use" in r and "did not answer in 0 s" in r for r in plan.refusals)


def test_the_stage_bar_speaks_binary_units_as_its_summary_does(tmp_path):
    """#41: the bar's speed was rich's decimal MB/s beside its binary sizes and the summary's MiB/s. On a terminal
    (stderr a pty, where the bar is drawn) every rate is binary."""
    import os
    import pty
    import re
    import subprocess

    from tests.console import console_script, drain
    from .modelfiles import write_model

    write_model(tmp_path / "src", shards=2, elems=600_000)
    master, slave = pty.openpty()
    try:
        p = subprocess.run([console_script(), "model", "stage", "--from", str(tmp_path / "src"), "--to",
                            str(tmp_path / "dst"), "--apply"], stdout=subprocess.PIPE, stderr=slave,
                           stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "160", "TERM": "xterm"}, timeout=60)
        os.close(slave)
        slave = None
        raw = drain(master, 60)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    bar = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw.decode("utf-8", "replace"))
    assert p.returncode == 0, (p.stdout, bar)
    rates = re.findall(r"[\d.]+ ?([kKMG]i?B)/s", bar + p.stdout.decode())
    assert rates and all(u.endswith("iB") for u in rates), (rates, bar)


def test_dry_run_exits_as_fix_does(cli, tmp_path, shm_dir, state_dir):
    """docs/cli.md (#41): a dry run with a copy planned is 1, as `fix`'s; once DST is whole it is 0."""
    write_model(tmp_path / "m", shards=2)
    assert cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir).code == 1
    assert cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--apply").code == 0
    r = cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir)
    assert r.code == 0 and "nothing to copy" in r.out, r.out + r.err
    doc = json.loads(cli("model", "stage", "--from", tmp_path / "m", "--to", shm_dir, "--json").out)
    assert doc["schema"] == "gpudoctor.model-stage/1"
