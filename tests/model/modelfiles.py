"""Real model directories and Hugging Face caches for tests, written byte by byte (no safetensors library).

The safetensors format: 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}, space-padded to a multiple of 8), then the data section.
"""

from __future__ import annotations

import hashlib
import json
import os
from math import prod
from pathlib import Path

DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "F64": 8}


def safetensors_bytes(tensors: dict[str, tuple[str, tuple[int, ...]]], seed: int = 0,
                      metadata: dict | None = None) -> bytes:
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = bytearray()
    for i, (name, (dtype, shape)) in enumerate(tensors.items()):
        n = prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + n]}
        data += bytes((seed * 31 + i * 7 + k) % 251 for k in range(n))
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + bytes(data)


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def model_files(shards: int = 3, tensors_per_shard: int = 2, elems: int = 64, sharded: bool = True) -> dict:
    """{relative name: bytes} of a small but real model."""
    files: dict[str, bytes] = {
        "config.json": json.dumps({"architectures": ["TinyForCausalLM"], "hidden_size": 8}).encode(),
        "generation_config.json": b'{"do_sample": false}',
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"vocab": {"a": 0, "b": 1}}}).encode(),
    }
    if not sharded:
        files["model.safetensors"] = safetensors_bytes(
            {f"layer.{t}.weight": ("BF16", (elems,)) for t in range(tensors_per_shard)}, seed=1)
        return files
    weight_map, total = {}, 0
    for s in range(1, shards + 1):
        tensors = {f"layers.{s}.w{t}": ("BF16", (elems,)) for t in range(tensors_per_shard)}
        files[shard_name(s, shards)] = safetensors_bytes(tensors, seed=s, metadata={"format": "pt"})
        for t in tensors:
            weight_map[t] = shard_name(s, shards)
        total += sum(elems * 2 for _ in tensors)
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1).encode()
    return files


def write_model(root: Path, **kw) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    files = model_files(**kw)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_hf_cache(cache: Path, repo: str = "acme/tiny", commit: str = "a" * 40, **kw) -> tuple[Path, dict]:
    """A real HF hub cache layout: blobs/<hash>, refs/main, snapshots/<commit>/<file> -> ../../blobs/<hash>.
    Weights are LFS blobs named by sha256; small files git blobs named by sha1."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    files = model_files(**kw)
    blobs = {}
    for name, data in files.items():
        h = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_sha1(data)
        (folder / "blobs" / h).write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(folder / "blobs" / h, link.parent), link)
        blobs[name] = h
    return folder, blobs
