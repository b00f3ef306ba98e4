"""host/childpy.py, the one launcher of child pythons (#48 item 6: what child_env keeps had no test): the argv is
isolated, the environment minimal, and what a child needs from the GPU stack survives."""

from __future__ import annotations

from gpudoctor.host import childpy


def test_python_argv_isolates_and_drops_site_on_request():
    assert childpy.python_argv(["/p"], "-c", "x") == ["/p", "-I", "-c", "x"]
    assert childpy.python_argv(["/p", "-X", "utf8"], "-", "a", site=False) == ["/p", "-X", "utf8", "-I", "-S", "-", "a"]


def test_child_env_keeps_the_gpu_stack_and_nothing_of_python():
    base = {"PATH": "/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C", "LC_CTYPE": "C.UTF-8", "TZ": "UTC",
            "TMPDIR": "/var/tmp", "CUDA_VISIBLE_DEVICES": "0",
            "NCCL_DEBUG": "INFO", "NVIDIA_VISIBLE_DEVICES": "all", "LD_LIBRARY_PATH": "/usr/lib/x",
            "PYTHONPATH": "/tmp/evil", "PYTHONHOME": "/tmp/evil", "PYTHONSTARTUP": "/tmp/evil.py",
            "LD_PRELOAD": "/tmp/evil.so", "SECRET_TOKEN": "s3cret", "AWS_SECRET_ACCESS_KEY": "k"}
    env = childpy.child_env(base)
    for k in ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG",
              "NVIDIA_VISIBLE_DEVICES",
              "LD_LIBRARY_PATH"):
        assert env.get(k) == base[k], k
    for k in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_PRELOAD", "SECRET_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        assert k not in env, k


def test_child_env_has_a_path_and_extra_wins():
    env = childpy.child_env({}, {"PATH": "/opt/bin", "X": "1"})
    assert env == {"PATH": "/opt/bin", "X": "1"}
    env = childpy.child_env({"HOME": "/h"})
    assert env["PATH"] == childpy.DEFAULT_PATH and env["PATH"].startswith("/") and env["HOME"] == "/h"


def test_run_refuses_a_cwd_or_env_of_the_callers():
    """A caller cannot take childpy's argv and start the child in its own directory or environment."""
    import sys

    import pytest

    for kw in ({"cwd": "/tmp"}, {"env": {"PYTHONPATH": "/tmp"}}):
        with pytest.raises(TypeError, match="sets cwd and env itself"):
            childpy.run([sys.executable], "-c", "pass", **kw)
    r = childpy.run([sys.executable], "-c", "import os, sys; print(os.getcwd(), sys.flags.isolated)",
                    capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == ["/", "1"]
