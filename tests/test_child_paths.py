"""No test may put this checkout on a child process's PYTHONPATH or sys.path: the child would import the source
tree, whose layout is not the installed package's (checks/ and remedies/ are gpudoctor.checks/.remedies only when
installed). With an editable install that goes unnoticed; with a real install — CI's, a user's — it is an
ImportError. Children get tests/childenv.pythonpath(): tests.* from here, gpudoctor from the installed package."""

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# PYTHONPATH set to (or starting with) a name for the checkout, or the checkout inserted at the front of sys.path
BAD = re.compile(r"""PYTHONPATH["']?\]?\s*[:=]\s*(?:str\()?\s*(?:ROOT|REPO|L\.REPO|CHECKOUT)\b"""
                 r"""|PYTHONPATH\s*:\s*["']\{(?:ROOT|REPO)\}|sys\.path\.insert\(\s*0\s*,\s*(?:str\()?\s*(?:ROOT|REPO)""")


def test_no_test_puts_the_checkout_on_a_childs_path():
    hits = []
    for p in sorted(TESTS.rglob("*.py")):
        if p.name == Path(__file__).name:
            continue
        for no, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if BAD.search(line):
                hits.append(f"{p.relative_to(TESTS.parent)}:{no}: {line.strip()}")
    assert not hits, "use tests.childenv.pythonpath() instead:\n" + "\n".join(hits)


def test_the_rule_would_see_the_old_forms():
    for bad in ('env.update(PYTHONPATH=str(ROOT), COLUMNS="120")', 'env={"PYTHONPATH": str(L.REPO)}',
                'e["PYTHONPATH"] = str(REPO) + os.pathsep', "sys.path.insert(0, str(ROOT))"):
        assert BAD.search(bad), bad
