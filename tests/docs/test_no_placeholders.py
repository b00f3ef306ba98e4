"""No placeholder in a message where gpudoctor knows the value or can say it in words (#19, acceptance 2).

The H200/LXC runs showed "pct reboot VMID", "200-seed.conf's config" and "--from SRC" in hints. This scans every
string literal of the product for the patterns that produced them, and runs the audit on a config whose name holds no
VMID."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for d in ("gpudoctor", "checks", "remedies") for p in sorted((ROOT / d).rglob("*.py"))]
BANNED = [
    (re.compile(r"\b(pct|qm) (reboot|unlock|set|start|stop) (VMID|CTID|ID)\b"), "a pct command with a VMID placeholder"),
    (re.compile(r"--from SRC\b"), "a stage command with an SRC placeholder"),
    (re.compile(r"\b(docker|podman) (restart|rm -f) NAME\b"), "a container command with a NAME placeholder"),
    (re.compile(r"`char-NAME rw`|/sys/fs/cgroup/PATH\b"), "a systemd or bpftool hint with a placeholder"),
]
FALLBACK = re.compile(r"""\bor\s+(['"])(VMID|SRC|DST|NAME)\1""")  # `inp.vmid or 'VMID'`: a value known or a placeholder


def _strings(tree):
    """String literals, docstrings left out (they describe, they are not printed)."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_placeholder_patterns_in_product_strings():
    bad = []
    for path in SOURCES:
        text = path.read_text()
        for m in FALLBACK.finditer(text):
            bad.append(f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: `{m.group(0)}`")
        for lineno, s in _strings(ast.parse(text)):
            for rx, what in BANNED:
                if rx.search(s) and "metavar" not in s:
                    bad.append(f"{path.relative_to(ROOT)}:{lineno}: {what}: {s[:80]!r}")
    assert bad == []
