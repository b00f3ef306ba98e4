"""How gpudoctor starts a child python (#40, #47): the one door every child interpreter goes through.

gpudoctor runs as root where other users have shells, so a child python must not import what they control: `-I`
keeps the working directory and the script's directory off sys.path and ignores PYTHON* variables and the user site
(a `json.py` planted in the working directory is never imported), and the child starts in `CWD` ("/").

Two ways out, nothing else builds a python command line (tests/core/test_one_child_launcher.py walks the package):
- `python_argv(...)`: the command line for `Host.run`, whose backends start every command in `CWD` (host/local.py;
  over SSH the remote login's own directory, which `-I` keeps off sys.path) and whose command lines snapshots replay.
- `spawn(...)` / `run(...)`: a child gpudoctor starts itself (not through `Host.run`): the argv, the cwd `CWD` and the
  allow-listed environment `child_env()` come together, so a caller cannot take one without the others.

Stdlib only, and only `os` at import: host/early.py uses it before anything else is imported, and
gather/deep_python.py sends this file's text with its search probe (so over SSH the same code starts the child).
"""

import os

ISOLATED = "-I"  # no cwd or script directory on sys.path, no PYTHON* variables, no user site-packages
NO_SITE = "-S"  # stdlib-only probes: no site-packages either (also much faster to start)
CWD = "/"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "LD_LIBRARY_PATH")
_KEEP_PREFIXES = ("CUDA_", "NCCL_", "NVIDIA_")


def python_argv(python, *rest, site: bool = True) -> list:
    """`[*python, -I (, -S), *rest]`; `rest` is usually "-c", PROGRAM, ARGS... or "-", ARGS... (program on stdin).
    For `Host.run` only (it starts the command in `CWD`); a child started here directly goes through `spawn`."""
    return [*python, ISOLATED, *(() if site else (NO_SITE,)), *rest]


def child_env(base=None, extra=None) -> dict:
    """A minimal environment for a child python: PATH, locale, HOME and what the GPU stack reads (CUDA_*, NCCL_*,
    NVIDIA_*, LD_LIBRARY_PATH) from `base` (default this process's), nothing else (no PYTHON*), then `extra`."""
    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if k in _KEEP or k.startswith(_KEEP_PREFIXES)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(extra or {})
    return env


class Spawn:
    """A child python as gpudoctor starts it itself: its argv, its working directory and its environment, together
    (`subprocess.run(s.argv, **s.popen_kwargs(), ...)`, or `run(...)` below)."""

    __slots__ = ("argv", "cwd", "env")

    def __init__(self, argv, env):
        self.argv, self.cwd, self.env = argv, CWD, env

    def popen_kwargs(self) -> dict:
        return {"cwd": self.cwd, "env": self.env}


def spawn(python, *rest, site: bool = True, base=None, extra=None) -> Spawn:
    """The child `python_argv(python, *rest, site=site)` in `CWD` with `child_env(base, extra)`."""
    return Spawn(python_argv(python, *rest, site=site), child_env(base, extra))


def run(python, *rest, site: bool = True, base=None, extra=None, **kw):
    """subprocess.run of `spawn(...)`: the caller gives what to do with its streams and its deadline, never its own
    cwd or environment (`base`/`extra` shape the allow-listed one)."""
    import subprocess

    if "cwd" in kw or "env" in kw:
        raise TypeError("childpy.run sets cwd and env itself (base=, extra= shape the environment)")
    s = spawn(python, *rest, site=site, base=base, extra=extra)
    return subprocess.run(s.argv, **s.popen_kwargs(), **kw)
