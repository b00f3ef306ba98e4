"""The suite tests the package a user installs: gpudoctor comes from site-packages, never from this checkout."""

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import gpudoctor
import gpudoctor.checks
import gpudoctor.remedies

from tests.needs import in_ci

CHECKOUT = Path(__file__).resolve().parents[1]


def _editable_mapping() -> dict[str, str] | None:
    """The module -> directory map of the installed distribution when it is an editable install (setuptools writes a
    finder into site-packages; pip records `dir_info.editable` in direct_url.json), else None."""
    path = [p for p in sys.path if Path(p or ".").resolve() != CHECKOUT]  # not the checkout's own gpudoctor.egg-info
    (dist,) = importlib.metadata.distributions(name="gpudoctor", path=path)
    if not json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable"):
        return None
    (finder,) = [f for f in sys.meta_path if getattr(f, "__module__", "").startswith("__editable___gpudoctor")]
    return sys.modules[finder.__module__].MAPPING


def test_gpudoctor_is_imported_from_the_installed_package():
    mapping = None if in_ci() else _editable_mapping()
    for mod in (gpudoctor, gpudoctor.checks, gpudoctor.remedies):
        where = Path(mod.__file__).resolve()
        if mapping is None:  # `pip install .` (always under CI): a real copy in site-packages, like a user's
            assert "site-packages" in where.parts and CHECKOUT not in where.parents, where
        else:  # a developer's editable install: exactly where its map points (gpudoctor.checks -> <checkout>/checks),
            # which the source tree on sys.path never gives (it has no gpudoctor/checks)
            assert where == Path(mapping[mod.__name__]).resolve() / "__init__.py", (where, mapping)


def test_a_child_process_started_in_the_checkout_imports_the_same_package():
    out = subprocess.run([sys.executable, "-c", "import gpudoctor.checks as c; print(c.__file__)"], cwd=CHECKOUT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() == Path(gpudoctor.checks.__file__).resolve()
