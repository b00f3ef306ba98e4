"""Synthetic safetensors models for the benches: real headers, sparse or real data. Stdlib only."""

from __future__ import annotations

import json
import os

LAYER_TENSORS = ("input_layernorm.weight", "mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                 "post_attention_layernorm.weight", "self_attn.k_proj.weight", "self_attn.o_proj.weight",
                 "self_attn.q_proj.weight", "self_attn.v_proj.weight")


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def shard_header(shard: int, shard_bytes: int, tensors: int) -> tuple[bytes, dict]:
    """A header of `tensors` BF16 tensors (realistic names) whose data adds up to about shard_bytes."""
    per = max(2, (shard_bytes // tensors) // 2 * 2)
    header, off, names = {"__metadata__": {"format": "pt"}}, 0, {}
    for t in range(tensors):
        name = f"model.layers.{shard * 1000 + t // len(LAYER_TENSORS)}.{LAYER_TENSORS[t % len(LAYER_TENSORS)]}"
        header[name] = {"dtype": "BF16", "shape": [per // 2], "data_offsets": [off, off + per]}
        names[name] = off
        off += per
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, {"data": off, "names": list(names)}


def write_model(root: str, *, shards: int, shard_bytes: int, tensors: int = 40, sparse: bool = True,
                pool: bytes | None = None) -> int:
    """config.json, tokenizer.json, the index and `shards` shards; returns the total bytes. sparse=False writes real
    data (a random pool at shifting offsets: nothing compresses or dedups it) and fsyncs."""
    os.makedirs(root, exist_ok=True)
    weight_map, total_data, total = {}, 0, 0
    for i in range(1, shards + 1):
        head, info = shard_header(i, shard_bytes, tensors)
        name = shard_name(i, shards)
        path = os.path.join(root, name)
        size = len(head) + info["data"]
        with open(path, "wb") as fh:
            fh.write(head)
            if sparse:
                fh.truncate(size)
            else:
                _fill(fh, info["data"], pool or os.urandom(64 << 20), seed=i)
                fh.flush()
                os.fsync(fh.fileno())
        for n in info["names"]:
            weight_map[n] = name
        total_data += info["data"]
        total += size
    files = {"config.json": json.dumps({"architectures": ["BenchForCausalLM"], "hidden_size": 5120}),
             "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE"}}),
             "model.safetensors.index.json": json.dumps({"metadata": {"total_size": total_data},
                                                         "weight_map": weight_map}, indent=1)}
    for name, text in files.items():
        with open(os.path.join(root, name), "w") as fh:
            fh.write(text)
        total += len(text)
    return total


def _fill(fh, nbytes: int, pool: bytes, seed: int) -> None:
    mv = memoryview(pool)
    k = (seed * 7919 * 4096) % len(pool)
    left = nbytes
    while left:
        a = mv[k:k + left]
        fh.write(a)
        left -= len(a)
        if left:
            b = mv[:min(k, left)]
            fh.write(b)
            left -= len(b)
        k = (k + 1048573) % len(pool)


def evict(root: str) -> None:
    """Drop the page cache of every file under root (posix_fadvise DONTNEED; no root needed for clean pages)."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            try:
                fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
