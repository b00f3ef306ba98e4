"""What of a process's environment may leave the machine (#40): an allow-list of the keys diagnosis reads, with
the values of secret-looking names redacted.

A snapshot records every read of a gather; PID 1's environment (read for `container=`) can hold HF_TOKEN, cloud keys
and passwords. Only the keys below are kept (what the checks and a human debugging a GPU host read: the container
marker, the CUDA/NVIDIA/NCCL variables, the library and program paths, gpudoctor's own bench markers), and any kept key
whose name looks like a secret has its value replaced. Stdlib only.
"""

import re

# Kept: names exactly, or by prefix.
KEEP = frozenset({"container", "container_uuid", "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOSTNAME", "LANG", "TERM",
                  "KUBERNETES_SERVICE_HOST", "SLURM_JOB_ID", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL"})
KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "GPUDOCTOR_BENCH_", "SGLANG_", "VLLM_", "TORCH_", "PYTORCH_")
SECRET = re.compile(r"TOKEN|KEY|SECRET|PASS|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|CERT", re.I)
REDACTED = "<redacted>"


def keep(name: str) -> bool:
    """The key matters to diagnosis (and may leave the machine)."""
    return name in KEEP or name.startswith(KEEP_PREFIXES)


def scrub_raw(raw: bytes) -> bytes:
    """/proc/PID/environ's bytes (NUL-separated NAME=VALUE) with only the allowed keys, a secret-looking name's value
    redacted."""
    out = []
    for item in raw.split(b"\0"):
        name, eq, value = item.partition(b"=")
        key = name.decode("utf-8", "replace")
        if eq and keep(key):
            out.append(name + b"=" + (REDACTED.encode() if SECRET.search(key) else value))
    return b"\0".join(out) + (b"\0" if out else b"")


def is_environ(path: str) -> bool:
    """A process's environment file (/proc/PID/environ, /proc/self/environ, under a test root too)."""
    return re.search(r"/proc/[^/]+/environ$", path or "") is not None
