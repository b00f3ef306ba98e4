"""Run gpudoctor's CLI with some inventory hosts rooted in temp directories: `python -m tests.rooted ARGS...`.

The product's inventory has no test keys. Tests that need a host whose files live under a temp root (real files and
mknod'ed nodes) and whose PATH starts with stand-in tools name it in $GPUDOCTOR_TEST_ROOTS (roots_env() builds it):
    {"gpu1": {"root": "/tmp/.../root", "path": ["/tmp/.../bin"]}, ...}
This launcher wraps gpudoctor.target.host_for — the one place hosts are built — so the Host of each such entry maps
every absolute path of a file operation under its root (Host._path) and puts the directories first on PATH; then
it runs the CLI as `gpudoctor` would. Commands are not mapped (the stand-ins act on the root themselves).
"""

from __future__ import annotations

import json
import os
import sys

ENV = "GPUDOCTOR_TEST_ROOTS"


def roots_env(**hosts) -> dict[str, str]:
    """{ENV: json} for hosts given as name=(root, [path dirs]) or name=root."""
    spec = {}
    for name, v in hosts.items():
        root, path = (v, []) if isinstance(v, (str, os.PathLike)) else v
        spec[name] = {"root": str(root), "path": [str(p) for p in path]}
    return {ENV: json.dumps(spec)}


def install() -> None:
    import gpudoctor.target as target

    roots = json.loads(os.environ.get(ENV) or "{}")
    build = target.host_for

    def host_for(entry, **kw):
        host = build(entry, **kw)
        spec = roots.get(entry.name)
        if spec:
            host.root = spec["root"].rstrip("/")
            host.path_prepend = list(spec.get("path") or [])
        return host

    target.host_for = host_for


if __name__ == "__main__":
    install()
    from gpudoctor.cli import main

    sys.argv[0] = "gpudoctor"
    main(sys.argv[1:])


def use_roots(monkeypatch, **hosts) -> None:
    """Set $GPUDOCTOR_TEST_ROOTS for the CLI runs of this test (see roots_env)."""
    for k, v in roots_env(**hosts).items():
        monkeypatch.setenv(k, v)


CLI = [sys.executable, "-m", "tests.rooted"]  # instead of [python, -m, gpudoctor]
