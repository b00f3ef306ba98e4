"""The suite tests the package a user installs: gpudoctor comes from site-packages, never from this checkout."""

import subprocess
import sys
from pathlib import Path

import gpudoctor
import gpudoctor.checks
import gpudoctor.remedies

from tests.needs import in_ci

CHECKOUT = Path(__file__).resolve().parents[1]


def test_gpudoctor_is_imported_from_the_installed_package():
    for mod in (gpudoctor, gpudoctor.checks, gpudoctor.remedies):
        where = Path(mod.__file__).resolve()
        if in_ci():  # CI installs with `pip install .`: a real copy in site-packages, like a user's
            assert "site-packages" in where.parts and CHECKOUT not in where.parents, where
        else:  # a developer's editable install maps to the checkout; the source tree on sys.path never does
            assert (where.parent / "__init__.py").exists(), where


def test_a_child_process_started_in_the_checkout_imports_the_same_package():
    out = subprocess.run([sys.executable, "-c", "import gpudoctor.checks as c; print(c.__file__)"], cwd=CHECKOUT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() == Path(gpudoctor.checks.__file__).resolve()
