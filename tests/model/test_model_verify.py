"""`gpudoctor model verify` on real model directories and Hugging Face caches written by the tests."""

from __future__ import annotations

import json
import os

import pytest

from gpudoctor.model import probe
from .modelfiles import safetensors_bytes, shard_name, write_hf_cache, write_model


def kinds(rep):
    return sorted((p["kind"], p["file"]) for p in rep["problems"])


# --- plain model directories --------------------------------------------------------------------------------------
def test_complete_sharded_model(cli, tmp_path):
    write_model(tmp_path / "m", shards=4)
    r = cli("model", "verify", tmp_path / "m")
    assert r.code == 0, r.out
    assert "COMPLETE" in r.out and "4 safetensors file(s) via model.safetensors.index.json" in r.out


def test_complete_single_file_model(cli, tmp_path):
    write_model(tmp_path / "m", sharded=False)
    rep = probe.verify_model(str(tmp_path / "m"))
    assert rep["complete"] and rep["weights"]["shards"] == 1 and rep["weights"]["index"] is None
    (tmp_path / "m" / "model.safetensors").write_bytes((tmp_path / "m" / "model.safetensors").read_bytes()[:-1])
    r = cli("model", "verify", tmp_path / "m")
    assert r.code == 2 and "truncated" in r.out and "model.safetensors" in r.out


def test_one_shard_missing_is_named(cli, tmp_path):
    write_model(tmp_path / "m", shards=3)
    os.unlink(tmp_path / "m" / shard_name(2, 3))
    r = cli("model", "verify", tmp_path / "m")
    assert r.code == 2
    line = next(ln for ln in r.out.splitlines() if shard_name(2, 3) in ln)
    assert line.split()[0] == "missing" and "actual absent" in line and "named by model.safetensors.index.json" in line


def test_one_shard_truncated_names_expected_and_actual(cli, tmp_path):
    files = write_model(tmp_path / "m", shards=3)
    full = len(files[shard_name(3, 3)])
    with open(tmp_path / "m" / shard_name(3, 3), "r+b") as fh:
        fh.truncate(full - 10)
    r = cli("model", "verify", "--json", tmp_path / "m")
    assert r.code == 2
    rep = json.loads(r.out)
    assert [(p["kind"], p["file"], p["expected"], p["actual"]) for p in rep["problems"]] == [
        ("truncated", shard_name(3, 3), full, full - 10)]
    human = cli("model", "verify", tmp_path / "m").out
    assert f"expected {full} B ({full} bytes), actual {full - 10} B ({full - 10} bytes)" in human


def test_index_naming_a_shard_that_does_not_exist(tmp_path):
    write_model(tmp_path / "m", shards=2)
    idx = tmp_path / "m" / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors"
    idx.write_text(json.dumps(data))
    rep = probe.verify_model(str(tmp_path / "m"))
    assert kinds(rep) == [("missing", "model-00003-of-00002.safetensors")]


def test_shard_from_another_revision(tmp_path):
    write_model(tmp_path / "m", shards=2)
    (tmp_path / "m" / shard_name(1, 2)).write_bytes(safetensors_bytes({"other.w0": ("BF16", (64,)),
                                                                       "other.w1": ("BF16", (64,))}))
    rep = probe.verify_model(str(tmp_path / "m"))
    assert kinds(rep) == [("tensor_not_in_shard", shard_name(1, 2))]
    assert "2 tensor(s)" in rep["problems"][0]["detail"]


def test_config_missing_or_broken_and_bad_index(tmp_path):
    write_model(tmp_path / "m", shards=2)
    os.unlink(tmp_path / "m" / "config.json")
    assert kinds(probe.verify_model(str(tmp_path / "m"))) == [("missing", "config.json")]
    (tmp_path / "m" / "config.json").write_text('{"architectures": [')
    assert kinds(probe.verify_model(str(tmp_path / "m"))) == [("bad_json", "config.json")]
    (tmp_path / "m" / "config.json").write_text('{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")  # a nesting bomb
    rep = probe.verify_model(str(tmp_path / "m"))
    assert kinds(rep) == [("bad_json", "config.json")] and "nests too deeply" in rep["problems"][0]["detail"]
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "model.safetensors.index.json").write_text('{"weight_map": ')
    rep = probe.verify_model(str(tmp_path / "m"))
    assert ("bad_index", "model.safetensors.index.json") in kinds(rep) and not rep["complete"]


def test_metadata_only_directory_and_empty_directory(cli, tmp_path):
    write_model(tmp_path / "m", shards=3)
    for i in (1, 2, 3):
        os.unlink(tmp_path / "m" / shard_name(i, 3))
    rep = probe.verify_model(str(tmp_path / "m"))
    assert ("metadata_only", None) in kinds(rep)
    assert sum(p["kind"] == "missing" for p in rep["problems"]) == 3
    (tmp_path / "e").mkdir()
    r = cli("model", "verify", tmp_path / "e")
    assert r.code == 2 and "empty" in r.out


def test_bin_index_model(tmp_path):
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text("{}")
    (m / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}))
    (m / "pytorch_model-00001-of-00002.bin").write_bytes(b"x" * 100)
    (m / "pytorch_model-00002-of-00002.bin").write_bytes(b"")
    rep = probe.verify_model(str(m))
    assert kinds(rep) == [("truncated", "pytorch_model-00002-of-00002.bin")]
    assert rep["weights"]["format"] == "other"


def test_hf_local_dir_download_in_progress(tmp_path):
    write_model(tmp_path / "m", shards=2)
    dl = tmp_path / "m" / ".cache" / "huggingface" / "download"
    dl.mkdir(parents=True)
    (dl / "model-00002-of-00002.safetensors.abc.incomplete").write_bytes(b"x")
    rep = probe.verify_model(str(tmp_path / "m"))
    assert [p["kind"] for p in rep["problems"]] == ["incomplete_blob"]


def test_leftover_partial_copy_is_a_note_not_a_problem(tmp_path):
    write_model(tmp_path / "m", shards=2)
    (tmp_path / "m" / f".{shard_name(1, 2)}{probe.PART_SUFFIX}").write_bytes(b"abc")
    rep = probe.verify_model(str(tmp_path / "m"))
    assert rep["complete"] and rep["partials"] == [f".{shard_name(1, 2)}{probe.PART_SUFFIX}"]
    assert "leftover partial copy" in rep["notes"][0]


# --- Hugging Face cache ---------------------------------------------------------------------------------------------
def test_hf_cache_complete_and_hash(cli, tmp_path):
    folder, _ = write_hf_cache(tmp_path / "hub", shards=3)
    r = cli("model", "verify", folder, "--hash")
    assert r.code == 0, r.out
    assert "hashes    7 of 7 match" in r.out and "aaaaaaaaaaaa" in r.out


def test_hf_cache_hash_mismatch_same_size(cli, tmp_path):
    folder, blobs = write_hf_cache(tmp_path / "hub", shards=2)
    blob = folder / "blobs" / blobs[shard_name(2, 2)]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF  # same size, header intact: only --hash can see it
    blob.write_bytes(bytes(data))
    assert cli("model", "verify", folder).code == 0
    r = cli("model", "verify", folder, "--hash", "--json")
    assert r.code == 2
    rep = json.loads(r.out)
    assert [(p["kind"], p["file"], p["expected"]) for p in rep["problems"]] == [
        ("hash_mismatch", shard_name(2, 2), blobs[shard_name(2, 2)])]
    # a git (sha1) blob: config.json
    cfg = folder / "blobs" / blobs["config.json"]
    cfg.write_text(cfg.read_text().replace("8", "9"))
    rep = json.loads(cli("model", "verify", folder, "--hash", "--json").out)
    assert ("hash_mismatch", "config.json") in kinds(rep)


def test_hf_cache_dangling_symlink(cli, tmp_path):
    folder, blobs = write_hf_cache(tmp_path / "hub", shards=3)
    os.unlink(folder / "blobs" / blobs[shard_name(2, 3)])
    r = cli("model", "verify", folder)
    assert r.code == 2
    rep = probe.verify_model(str(folder))
    assert kinds(rep) == [("dangling_symlink", shard_name(2, 3))]
    assert f"../../blobs/{blobs[shard_name(2, 3)]}" in rep["problems"][0]["detail"]


def test_hf_cache_incomplete_blob(tmp_path):
    folder, blobs = write_hf_cache(tmp_path / "hub", shards=2)
    (folder / "blobs" / ("f" * 64 + ".incomplete")).write_bytes(b"partial")
    rep = probe.verify_model(str(folder))
    assert kinds(rep) == [("incomplete_blob", f"blobs/{'f' * 64}.incomplete")]
    assert rep["problems"][0]["actual"] == 7


def test_hf_cache_metadata_only_snapshot(cli, tmp_path):
    folder, _ = write_hf_cache(tmp_path / "hub", shards=3)
    snap = folder / "snapshots" / ("a" * 40)
    for i in (1, 2, 3):  # snapshot_download(allow_patterns="*.json") leaves exactly this
        os.unlink(snap / shard_name(i, 3))
    r = cli("model", "verify", folder)
    assert r.code == 2 and "metadata_only" in r.out
    assert "names 3 shard(s); none is present" in r.out


def test_hf_cache_ref_and_snapshot_problems(tmp_path):
    folder, _ = write_hf_cache(tmp_path / "hub", shards=2)
    (folder / "refs" / "main").write_text("b" * 40)
    rep = probe.verify_model(str(folder))
    assert kinds(rep) == [("snapshot_missing", f"snapshots/{'b' * 40}")] and rep["dir"] is None
    os.unlink(folder / "refs" / "main")
    rep = probe.verify_model(str(folder))  # one snapshot: verified anyway, the missing ref is still reported
    assert kinds(rep) == [("ref_missing", "refs/main")] and rep["dir"].endswith("a" * 40)
    rep = probe.verify_model(str(folder), revision="a" * 40)
    assert rep["complete"] and rep["revision"] == "a" * 40


def test_snapshot_dir_given_directly(tmp_path):
    folder, _ = write_hf_cache(tmp_path / "hub", shards=2)
    rep = probe.verify_model(str(folder / "snapshots" / ("a" * 40)))
    assert rep["kind"] == "dir" and rep["complete"]


# --- marker-driven checks --------------------------------------------------------------------------------------------
def _marker(d, files, boot="x"):
    m = {"schema": probe.MARKER_SCHEMA, "boot_id": boot, "staged_at": 1.0, "source": "/src",
         "total_bytes": sum(files.values()), "files": [{"name": n, "size": s} for n, s in files.items()]}
    (d / probe.MARKER_NAME).write_text(json.dumps(m))


def test_marker_lists_a_file_that_is_gone(tmp_path):
    files = write_model(tmp_path / "m", shards=2)
    _marker(tmp_path / "m", {n: len(b) for n, b in files.items()})
    assert probe.verify_model(str(tmp_path / "m"))["complete"]
    os.unlink(tmp_path / "m" / "tokenizer.json")
    os.unlink(tmp_path / "m" / shard_name(1, 2))
    rep = probe.verify_model(str(tmp_path / "m"))
    assert kinds(rep) == [("missing", shard_name(1, 2)), ("missing", "tokenizer.json")]
    shard = next(p for p in rep["problems"] if p["file"] == shard_name(1, 2))
    assert shard["expected"] == len(files[shard_name(1, 2)])  # the marker knows the size the index does not


def test_hash_against_marker_and_nothing_to_hash(cli, tmp_path):
    write_model(tmp_path / "m", shards=2)
    r = cli("model", "verify", "--hash", tmp_path / "m")
    assert r.code == 3 and r.err.count("\n") == 1 and "--hash: nothing to compare against" in r.err
    import hashlib

    data = (tmp_path / "m" / shard_name(1, 2)).read_bytes()
    m = {"schema": probe.MARKER_SCHEMA, "boot_id": "x", "files": [
        {"name": shard_name(1, 2), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]}
    (tmp_path / "m" / probe.MARKER_NAME).write_text(json.dumps(m))
    assert cli("model", "verify", "--hash", tmp_path / "m").code == 0
    (tmp_path / "m" / shard_name(1, 2)).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    r = cli("model", "verify", "--hash", tmp_path / "m")
    assert r.code == 2 and "hash_mismatch" in r.out


def test_json_report_shape(cli, tmp_path):
    write_model(tmp_path / "m", shards=2)
    rep = json.loads(cli("model", "verify", "--json", tmp_path / "m").out)
    for key in ("path", "kind", "complete", "problems", "weights", "files", "bytes", "marker", "mount", "boot_id"):
        assert key in rep
    assert rep["weights"]["index_total_size"] == rep["weights"]["data_bytes"]


@pytest.mark.parametrize("n_shards", [1, 50])
def test_fast_on_sparse_multi_gigabyte_layout(tmp_path, n_shards):
    """A 1 GiB-per-shard sparse layout verifies by headers alone (the timing itself lives in bench/)."""
    m = tmp_path / "m"
    m.mkdir()
    (m / "config.json").write_text("{}")
    wm = {}
    for i in range(1, n_shards + 1):
        name = shard_name(i, n_shards)
        header = json.dumps({f"t{i}": {"dtype": "U8", "shape": [1 << 30], "data_offsets": [0, 1 << 30]}}).encode()
        with open(m / name, "wb") as fh:
            fh.write(len(header).to_bytes(8, "little") + header)
            fh.truncate(8 + len(header) + (1 << 30))
        wm[f"t{i}"] = name
    (m / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    rep = probe.verify_model(str(m))
    assert rep["complete"] and rep["weights"]["bytes"] > n_shards << 30


def test_a_directory_of_model_directories_is_not_one_model(tmp_path, cli):
    """#19: `model verify /dev/shm` holding models was verified as one incomplete model (exit 2)."""
    write_model(tmp_path / "shm" / "Qwen3-a", shards=2)
    write_model(tmp_path / "shm" / "Llama-b", shards=1)
    (tmp_path / "shm" / "notes.txt").write_text("scratch\n")
    r = cli("model", "verify", tmp_path / "shm")
    assert r.code == 3 and "incomplete" not in (r.out + r.err).lower()
    assert "not a model directory: it holds 2 model directories: Llama-b, Qwen3-a" in r.err
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    r = cli("model", "verify", tmp_path / "shm" / "Qwen3-a")
    assert r.code == 0
    # a model with subfolders of its own (a second copy of the weights under original/) stays a model
    write_model(tmp_path / "m2", shards=1)
    write_model(tmp_path / "m2" / "original", shards=1)
    assert cli("model", "verify", tmp_path / "m2").code == 0


def test_hf_cache_old_stray_incomplete_blob_is_a_note(cli, tmp_path):
    """#41: an aborted download of another file, long ago, that no file of this revision links to: the revision is
    complete (every hash matches) and the stray blob is a note; one written lately still counts (a download may be
    running: huggingface_hub links a file only once its blob is whole)."""
    folder, blobs = write_hf_cache(tmp_path / "hub", shards=2)
    stray = folder / "blobs" / ("f" * 64 + ".incomplete")
    stray.write_bytes(b"partial")
    old = os.stat(stray).st_mtime - 7 * 3600
    os.utime(stray, (old, old))
    rep = probe.verify_model(str(folder))
    assert rep["complete"] and kinds(rep) == [], rep["problems"]
    assert any(n.startswith(f"blobs/{'f' * 64}.incomplete: a download interrupted 7 h ago") for n in rep["notes"])
    r = cli("model", "verify", "--hash", folder)
    assert r.code == 0 and "COMPLETE" in r.out, r.out
    os.utime(stray)  # touched now: a download may be on its way
    assert kinds(probe.verify_model(str(folder))) == [("incomplete_blob", f"blobs/{'f' * 64}.incomplete")]
