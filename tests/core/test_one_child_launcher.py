"""Acceptance (#47): every child python's command line comes from gpudoctor/host/childpy.py — no other product module
builds one by itself (a list whose first element is an interpreter, followed by an interpreter flag: `-c`, `-m`, `-`,
`-I`, `-S`, …), so a new call site cannot forget `-I`, cwd `/` and the allow-listed environment.

An interpreter is `sys.executable`, a name or attribute called like one (`python`, `py`, `host.python`, `*python`), or
a string naming one (`"python3"`). The exceptions are listed below, each with why.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "gpudoctor", ROOT / "checks", ROOT / "remedies"]
DOOR = "gpudoctor/host/childpy.py"
FLAGS = {"-", "-c", "-m", "-I", "-S", "-E", "-s", "-u", "-B", "-O", "-OO", "-P", "-q", "-b", "-bb", "-d", "-v", "-x"}
# (file, the interpreter expression as written): why it may stay
ALLOWED = {
    ("gpudoctor/host/agent_prog.py", "sys.executable"):
        "the remote agent swaps the interpreter of a command line childpy built on the caller's side (req['py'])",
}


def _interpreter(node) -> str | None:
    """The source text of `node` when it names a python interpreter, else None."""
    if isinstance(node, ast.Starred):
        node = node.value
    if isinstance(node, ast.Subscript):  # host.python[0], python[:1]
        node = node.value
    text = ast.unparse(node)
    if isinstance(node, ast.Constant):
        return text if isinstance(node.value, str) and node.value.rsplit("/", 1)[-1].startswith("python") else None
    if isinstance(node, (ast.Name, ast.Attribute)):
        last = node.id if isinstance(node, ast.Name) else node.attr
        if text == "sys.executable" or last.lower() in ("py", "python", "python3", "interpreter", "exe") \
                or last.lower().endswith(("python", "_py")):
            return text
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("str", "list", "os.fspath"):  # str(sys.executable)
        return _interpreter(node.args[0]) if node.args else None
    return None


def _is_flag(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
        node.value in FLAGS or node.value.startswith(("-W", "-X")))


def python_argvs(tree) -> list[tuple[int, str]]:
    """(line, interpreter) of each list/tuple literal `[PY, FLAG, ...]`, `[*PY, FLAG, ...]` or `[PY] + [FLAG, ...]`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= 2:
            py = _interpreter(node.elts[0])
            if py is not None and _is_flag(node.elts[1]):
                found.append((node.lineno, py))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = node.left, node.right
            py = _interpreter(left.elts[-1]) if isinstance(left, (ast.List, ast.Tuple)) and left.elts else \
                _interpreter(left)
            if py is None:
                continue
            if isinstance(right, (ast.List, ast.Tuple)) and right.elts and _is_flag(right.elts[0]) \
                    or not isinstance(right, (ast.List, ast.Tuple)):  # [sys.executable] + argv: a built argv too
                found.append((node.lineno, py))
    return found


SPAWNERS = {"subprocess.run", "subprocess.Popen", "subprocess.check_output", "subprocess.check_call",
            "subprocess.call", "os.execv", "os.execvp", "os.execve"}


def direct_spawns(tree) -> list[int]:
    """Lines where a `python_argv(...)` command line is started directly (not through Host.run, whose backends start
    it in `/`): that is what `childpy.spawn`/`childpy.run` are for, the argv with its cwd and environment."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and ast.unparse(node.func) in SPAWNERS and node.args and isinstance(node.args[0], ast.Call)
            and ast.unparse(node.args[0].func).rsplit(".", 1)[-1] == "python_argv"]


def product_files():
    for base in PRODUCT:
        yield from sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)


def test_only_childpy_builds_a_python_command_line():
    offenders, used = [], set()
    for p in product_files():
        rel = p.relative_to(ROOT).as_posix()
        if rel == DOOR:
            continue
        for line, py in python_argvs(ast.parse(p.read_text(), rel)):
            if (rel, py) in ALLOWED:
                used.add((rel, py))
            else:
                offenders.append(f"{rel}:{line}: [{py}, -…] (use gpudoctor.host.childpy.python_argv/spawn/run)")
        offenders += [f"{rel}:{line}: python_argv(...) started directly (use childpy.spawn/run: cwd and environment "
                      "come with it)" for line in direct_spawns(ast.parse(p.read_text(), rel))]
    assert offenders == [], "a child python built outside host/childpy.py:\n" + "\n".join(offenders)
    assert used == set(ALLOWED), f"allowed exceptions that no longer exist: {set(ALLOWED) - used}"


def test_no_python_flag_typed_by_hand_in_a_shell_program():
    """`"$py" -I -c` inside a `sh -c` program (bench/cell/health.py before #47) bypasses the door as well."""
    import re

    pat = re.compile(r'"?\$\{?py(thon)?\}?"?\s+-[IcmS]\b')
    offenders = []
    for p in product_files():
        rel = p.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(p.read_text(), rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and pat.search(node.value):
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == [], offenders


def test_the_scan_sees_each_way_of_building_one():
    src = '''
import sys
a = [*python, "-", child_args(0, [], s)]            # gather/deep_gpu.py before #47
b = [sys.executable, "-I", "-m", "gpudoctor"]        # campaign/slurm.py before #47
c = [host.python[0], "-c", "pass"]
d = [sys.executable] + ["-c", "pass"]
e = ["python3", "-m", "pip"]
f = ["nvidia-smi", "-q"]                              # not a python
g = [sys.executable]                                  # an interpreter prefix, no command line yet
h = python_argv([sys.executable], "-c", "pass")      # through the door
i = subprocess.run(python_argv([full], "-c", ASK), env=child_env(), cwd=CWD)  # the door's argv, its spawn by hand
'''
    assert direct_spawns(ast.parse(src)) == [11]
    assert [py for _, py in python_argvs(ast.parse(src))] == ["python", "sys.executable", "host.python",
                                                              "sys.executable", "'python3'"]


def test_a_direct_child_gets_its_cwd_and_environment_with_its_argv(monkeypatch):
    import pytest

    from gpudoctor.host import childpy

    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    s = childpy.spawn(["/usr/bin/python3"], "-c", "pass", site=False, extra={"NCCL_DEBUG": "INFO"})
    assert s.argv == ["/usr/bin/python3", "-I", "-S", "-c", "pass"] and s.cwd == "/"
    assert "PYTHONPATH" not in s.env and "HF_TOKEN" not in s.env and s.env["NCCL_DEBUG"] == "INFO"
    assert s.popen_kwargs() == {"cwd": "/", "env": s.env}
    cp = childpy.run(["/usr/bin/python3"], "-c", "import os, sys; print(os.getcwd(), sys.flags.isolated)",
                     capture_output=True, text=True, timeout=30)
    assert cp.stdout.split() == ["/", "1"]
    with pytest.raises(TypeError):
        childpy.run(["/usr/bin/python3"], "-c", "pass", cwd="/tmp")
