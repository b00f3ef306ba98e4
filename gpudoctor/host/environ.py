"""What of a process's environment and command line may leave the machine (#40, #47): an allow-list of the
environment keys diagnosis reads, and one rule for a secret-looking name, whose value is redacted wherever it is met.

A snapshot records every read of a gather; PID 1's environment (read for `container=`) can hold HF_TOKEN, cloud keys
and passwords. Only the keys below are kept (what the checks and a human debugging a GPU host read: the container
marker, the CUDA/NVIDIA/NCCL variables, the library and program paths, gpudoctor's own bench markers), and any kept key
whose name looks like a secret has its value replaced. A server's command line (gather/procs.py) carries its
`--api-key X`, `--hf-token=X`, `HF_TOKEN=X` (after `env`): `redact_argv` replaces those values by the same rule.
Stdlib only, and self-contained: gather/procs.py sends this file's text with its process scan, so the redaction
happens on the target, before anything is recorded.
"""

import re

# Kept: names exactly, or by prefix.
KEEP = frozenset({"container", "container_uuid", "PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOSTNAME", "LANG", "TERM",
                  "KUBERNETES_SERVICE_HOST", "SLURM_JOB_ID", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "GPU_DEVICE_ORDINAL"})
KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "NCCL_", "GPUDOCTOR_BENCH_", "SGLANG_", "VLLM_", "TORCH_", "PYTORCH_")
SECRET = re.compile(r"TOKEN|KEY|SECRET|PASS|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|CERT", re.I)
REDACTED = "<redacted>"
# Words that hold a secret-looking part but name no secret: SGLang's and vLLM's --max-total-tokens, --tokenizer-path,
# --max-num-batched-tokens; "bypass", "passthrough".
NOT_SECRET_WORDS = frozenset({"TOKENS", "TOKENIZER", "BYPASS", "PASSTHROUGH"})
_WORDS = re.compile(r"[-_.]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def secret_name(name: str) -> bool:
    """The name looks like it holds a secret (HF_TOKEN, api-key, DB_PASSWORD, AWS_SECRET_ACCESS_KEY): one of its words
    (split at -, _ and .) matches SECRET and is not one of NOT_SECRET_WORDS. The one rule for environments and argv."""
    return any(SECRET.search(w) and w.upper() not in NOT_SECRET_WORDS for w in _WORDS.split(name) if w)


def redact_argv(args: list) -> list:
    """`args` with the value of each secret-looking flag (`--api-key X`, `--api-key=X`, `-hf_token X`) and of each
    `NAME=value` item with a secret-looking NAME replaced by REDACTED; an item holding spaces (`sh -c "..."`) is
    redacted word by word. Everything else as it was."""
    out, hide = [], False
    for a in args:
        if hide and not a.startswith("--"):
            out.append(REDACTED)
            hide = False
            continue
        hide = False
        if a.startswith("-") and len(a) > 1:
            name, eq, _ = a.lstrip("-").partition("=")
            if secret_name(name):
                if eq:
                    out.append(a.split("=", 1)[0] + "=" + REDACTED)
                else:
                    out.append(a)
                    hide = True
                continue
        elif "=" in a:
            name = a.split("=", 1)[0]
            if _NAME.fullmatch(name) and secret_name(name):
                out.append(name + "=" + REDACTED)
                continue
        if " " in a.strip():
            words = a.split()
            kept = redact_argv(words)
            if kept != words:
                a = " ".join(kept)
        out.append(a)
    return out


def redact_cmdline(text):
    """A command line already joined with spaces (a snapshot recorded before #47): redacted word by word; unchanged
    where nothing looks secret."""
    if not text:
        return text
    words = text.split()
    kept = redact_argv(words)
    return text if kept == words else " ".join(kept)


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
            out.append(name + b"=" + (REDACTED.encode() if secret_name(key) else value))
    return b"\0".join(out) + (b"\0" if out else b"")


def is_environ(path: str) -> bool:
    """A process's environment file (/proc/PID/environ, /proc/self/environ, under a test root too)."""
    return re.search(r"/proc/[^/]+/environ$", path or "") is not None
