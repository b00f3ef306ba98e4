"""Acceptance (#47): one table of exit codes, gpudoctor/exitcodes.py, checked against docs/cli.md; no exit code is
written as a number anywhere else in the package (AST: the argument of SystemExit / sys.exit / os._exit / ctx.exit, an
`exit_code = N` assignment or class attribute, a module-level `EXIT_* = N`). The exceptions are listed with why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from gpudoctor import exitcodes

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "gpudoctor", ROOT / "checks", ROOT / "remedies"]
TABLE_MODULE = "gpudoctor/exitcodes.py"
EXITS = {"SystemExit", "sys.exit", "os._exit", "exit", "click.exceptions.Exit", "Exit"}
# (file, the code as written): why it may stay a number
ALLOWED = {
    ("gpudoctor/host/agent_prog.py", "*"):
        "the remote agent: a stdlib-only program sent over SSH, no gpudoctor there to import (its own end, and the "
        "shell's 127/126 for a command it could not start)",
    ("gpudoctor/host/ops.py", "os._exit(0)"): "a forked helper's own end after its answer, no command's exit code",
    ("gpudoctor/host/forked.py", "code = 0"): "a forked probe's status as the interpreter gives it (0, or 1 for an "
                                               "uncaught exception)",
    ("gpudoctor/host/forked.py", "code = 1"): "the same",
    ("gpudoctor/host/forked.py", "code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1"):
        "the same: sys.exit(None) is 0, sys.exit('text') is 1, as the interpreter has it",
    ("gpudoctor/cli.py", "os._exit(code if isinstance(code, int) else 0 if code is None else 1)"):
        "the interpreter's own rule for sys.exit(None) / sys.exit('text'), applied at the hard exit",
    ("gpudoctor/bench/standin/server.py", "*"): "the stand-in SGLang server (a test double) exits as a server "
                                                 "process, not as a gpudoctor command",
}


def _ints(node) -> bool:
    return any(isinstance(c, ast.Constant) and type(c.value) is int for c in ast.walk(node))


def _number_or_choice(node) -> bool:
    """`3`, or `0 if x else 1`: a number a variable named `code` (the usual exit status) is given."""
    if isinstance(node, ast.IfExp):
        return _number_or_choice(node.body) or _number_or_choice(node.orelse)
    return isinstance(node, ast.Constant) and type(node.value) is int


def literal_exits(tree) -> list[tuple[int, str]]:
    """(line, source) of each exit code written as a number."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = ast.unparse(node.func)
            if (f in EXITS or f.endswith((".exit", "._exit"))) and any(_ints(a) for a in node.args):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names = [ast.unparse(e) for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
                last = [n.rsplit(".", 1)[-1] for n in names]
                if any(n == "exit_code" or n.startswith(("EXIT_", "NPD_")) for n in last) and _ints(node.value) \
                        or last == ["code"] and _number_or_choice(node.value):
                    found.append((node.lineno, ast.unparse(node)))
    return found


def product_files():
    for base in PRODUCT:
        yield from sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_exit_code_is_a_number_outside_the_table():
    offenders, used = [], set()
    for p in product_files():
        rel = p.relative_to(ROOT).as_posix()
        if rel == TABLE_MODULE:
            continue
        for line, src in literal_exits(ast.parse(p.read_text(), rel)):
            key = (rel, "*") if (rel, "*") in ALLOWED else (rel, src)
            if key in ALLOWED:
                used.add(key)
            else:
                offenders.append(f"{rel}:{line}: {src}")
    assert offenders == [], "exit codes come from gpudoctor/exitcodes.py:\n" + "\n".join(offenders)
    assert used == set(ALLOWED), f"allowed exceptions that no longer exist: {set(ALLOWED) - used}"


def test_the_scan_sees_each_way_of_writing_one():
    src = '''
raise SystemExit(0 if released else 1)
sys.exit(0)
ctx.exit(0)
class Interrupted(GpudoctorError):
    exit_code = 130
err.exit_code = 143 if term else 130
EXIT_PIPE = 141
code = 0 if found else 1
raise SystemExit(EXIT_OK)
code, ctype, body = 500, "text/plain", b""
status = 404
'''
    assert sorted(line for line, _ in literal_exits(ast.parse(src))) == [2, 3, 4, 6, 7, 8, 9]


def _doc_table() -> dict[int, str]:
    """docs/cli.md's table of codes: `| **code** | `NAME` | meaning |` rows under "## Exit code table"."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text.split("\n## Exit code table\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for m in re.finditer(r"^\| \*\*(\d+)\*\* \| `(\w+)` \|", section, re.M):
        rows[int(m.group(1))] = m.group(2)
    return rows


def test_the_table_is_docs_cli_mds():
    doc = _doc_table()
    assert doc == {code: name for name, code in exitcodes.TABLE.items()}
    # the per-command table's columns are the judgment codes
    text = (ROOT / "docs" / "cli.md").read_text()
    assert "| command | 0 | 1 | 2 | 3 |" in text
    assert [exitcodes.EXIT_OK, exitcodes.EXIT_WARN, exitcodes.EXIT_FAIL, exitcodes.EXIT_UNKNOWN] == [0, 1, 2, 3]
    # errors.py and conventions.py hand on the table's values, not copies of their own
    from gpudoctor import conventions, errors
    from gpudoctor.integrations import npd

    for mod in (errors, conventions):
        for name in ("EXIT_OK", "EXIT_WARN", "EXIT_FAIL", "EXIT_UNKNOWN"):
            assert getattr(mod, name) == exitcodes.TABLE[name]
    assert (npd.NPD_OK, npd.NPD_PROBLEM, npd.NPD_UNKNOWN) == (exitcodes.NPD_OK, exitcodes.NPD_PROBLEM,
                                                               exitcodes.NPD_UNKNOWN)
