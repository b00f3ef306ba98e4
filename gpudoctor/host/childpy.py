"""How gpudoctor starts a child python (#40): the one argv and environment every child interpreter gets.

gpudoctor runs as root where other users have shells, so a child python must not import what they control: `-I`
keeps the working directory and the script's directory off sys.path and ignores PYTHON* variables and the user site
(a `json.py` planted in the working directory is never imported). A child gpudoctor starts itself (not through
Host.run, whose command lines a snapshot replays) also gets `child_env()` and cwd `CWD`. Stdlib only: host/early.py
uses it before anything else is imported.
"""

import os

ISOLATED = "-I"  # no cwd or script directory on sys.path, no PYTHON* variables, no user site-packages
NO_SITE = "-S"  # stdlib-only probes: no site-packages either (also much faster to start)
CWD = "/"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "LD_LIBRARY_PATH")
_KEEP_PREFIXES = ("CUDA_", "NCCL_", "NVIDIA_")


def python_argv(python, *rest, site: bool = True) -> list:
    """`[*python, -I (, -S), *rest]`; `rest` is usually "-c", PROGRAM, ARGS... or "-", ARGS... (program on stdin)."""
    return [*python, ISOLATED, *(() if site else (NO_SITE,)), *rest]


def child_env(base=None, extra=None) -> dict:
    """A minimal environment for a child python: PATH, locale, HOME and what the GPU stack reads (CUDA_*, NCCL_*,
    NVIDIA_*, LD_LIBRARY_PATH) from `base` (default this process's), nothing else (no PYTHON*), then `extra`."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if k in _KEEP or k.startswith(_KEEP_PREFIXES)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(extra or {})
    return env
