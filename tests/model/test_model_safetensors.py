"""The safetensors header rule: complete iff size == 8 + N + max(data_offsets end), judged without tensor data."""

from __future__ import annotations

import json

from gpudoctor.model import probe
from .modelfiles import safetensors_bytes


def test_hand_built_file_from_the_format_description(tmp_path):
    # Two F32 tensors: a [2] at 0..8 and b [1] at 8..12; the data section is 12 bytes.
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}'
    raw = len(header).to_bytes(8, "little") + header + bytes(range(12))
    f = tmp_path / "x.safetensors"
    f.write_bytes(raw)
    r = probe.check_safetensors(str(f))
    assert r["kind"] == "ok"
    assert r["expected"] == 8 + len(header) + 12 == len(raw)
    assert sorted(r["tensors"]) == ["a", "b"]


def test_every_cut_point_is_incomplete(tmp_path):
    data = safetensors_bytes({"w": ("BF16", (40,)), "b": ("F32", (3,))}, metadata={"format": "pt"})
    f = tmp_path / "s.safetensors"
    for cut in range(len(data)):
        f.write_bytes(data[:cut])
        r = probe.check_safetensors(str(f))
        assert r["kind"] in ("truncated", "bad_header"), (cut, r)
        assert r["size"] == cut
    f.write_bytes(data)
    assert probe.check_safetensors(str(f))["kind"] == "ok"


def test_truncated_after_the_header_names_expected_and_actual(tmp_path):
    data = safetensors_bytes({"w": ("F32", (100,))})
    f = tmp_path / "s.safetensors"
    f.write_bytes(data[:-50])
    r = probe.check_safetensors(str(f))
    assert (r["kind"], r["expected"], r["size"]) == ("truncated", len(data), len(data) - 50)


def test_oversized_and_zero_filled_and_garbage(tmp_path):
    data = safetensors_bytes({"w": ("F32", (10,))})
    f = tmp_path / "s.safetensors"
    f.write_bytes(data + b"\0" * 7)
    assert probe.check_safetensors(str(f))["kind"] == "oversized"
    f.write_bytes(b"\0" * 4096)  # a hole: what a preallocated, never-written file reads as
    assert probe.check_safetensors(str(f))["kind"] == "bad_header"
    f.write_bytes((20).to_bytes(8, "little") + b"this is not json!!!!" + b"\0" * 10)
    r = probe.check_safetensors(str(f))
    assert r["kind"] == "bad_header" and "not JSON" in r["detail"]
    f.write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    assert probe.check_safetensors(str(f))["kind"] == "bad_header"
    bad = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}).encode()
    f.write_bytes(len(bad).to_bytes(8, "little") + bad + b"\0" * 8)
    assert "data_offsets" in probe.check_safetensors(str(f))["detail"]


def test_large_header_beyond_the_first_read(tmp_path):
    tensors = {f"model.layers.{i}.mlp.experts.{j}.weight": ("BF16", (1,)) for i in range(60) for j in range(40)}
    data = safetensors_bytes(tensors)
    assert int.from_bytes(data[:8], "little") > probe.HEAD_READ
    f = tmp_path / "big.safetensors"
    f.write_bytes(data)
    r = probe.check_safetensors(str(f))
    assert r["kind"] == "ok" and len(r["tensors"]) == 2400


def test_sparse_file_is_judged_by_header_only(tmp_path):
    # a 4 GiB tensor described by the header; the data is a hole (never read)
    header = json.dumps({"w": {"dtype": "U8", "shape": [4 << 30], "data_offsets": [0, 4 << 30]}}).encode()
    f = tmp_path / "sparse.safetensors"
    with open(f, "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(8 + len(header) + (4 << 30))
    assert probe.check_safetensors(str(f))["kind"] == "ok"
    with open(f, "r+b") as fh:
        fh.truncate(8 + len(header) + (4 << 30) - 1)
    assert probe.check_safetensors(str(f))["kind"] == "truncated"


def test_header_bytes_tells_revisions_apart(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(safetensors_bytes({"w": ("F32", (4,))}))
    b.write_bytes(safetensors_bytes({"v": ("F32", (4,))}))
    assert len(a.read_bytes()) == len(b.read_bytes())
    assert probe.header_bytes(str(a)) != probe.header_bytes(str(b))
    assert probe.header_bytes(str(a)) == a.read_bytes()[:8 + int.from_bytes(a.read_bytes()[:8], "little")]
    assert probe.header_bytes(str(tmp_path / "none")) is None
