"""Every malformed inventory in tests/inventory/bad/ gives exactly one line `gpudoctor: FILE:LINE: what`, exit 3.

Each file's first line says what to expect: `# expect LINE: message fragment`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.cli import main

BAD = sorted((Path(__file__).parent / "bad").glob("*.yaml"))


def expectation(path: Path) -> tuple[int, str]:
    m = re.match(rb"# expect (\d+): (.*)\n", path.read_bytes())
    assert m, f"{path.name} lacks its '# expect LINE: fragment' header"
    return int(m.group(1)), m.group(2).decode()


def test_the_corpus_is_large_enough():
    assert len(BAD) >= 15


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_inventory_is_one_line_with_file_and_line_exit_3(path, capsys):
    line, fragment = expectation(path)
    with pytest.raises(SystemExit) as e:
        main(["inventory", "show", "--inventory", str(path)])
    out, err = capsys.readouterr()
    assert e.value.code == 3
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(f"gpudoctor: {path}:{line}: "), err
    assert fragment in err, err


@pytest.mark.parametrize("name", ["vmid_not_int", "syntax_tab", "address_with_shell", "not_utf8"])
def test_through_the_installed_entry_point(name):
    """The same through a real process: no traceback, one line on stderr, exit 3."""
    path = Path(__file__).parent / "bad" / f"{name}.yaml"
    line, fragment = expectation(path)
    p = subprocess.run([sys.executable, "-m", "gpudoctor", "inventory", "show", "--inventory", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3
    assert p.stdout == ""
    assert "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [p.stderr.strip()]
    assert p.stderr.startswith(f"gpudoctor: {path}:{line}: ") and fragment in p.stderr
    assert not Path("/tmp/gpudoctor-pwned").exists()


def test_missing_inventory_file_is_exit_3(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["inventory", "show", "--inventory", str(tmp_path / "nope.yaml")])
    assert e.value.code == 3
    assert capsys.readouterr().err == f"gpudoctor: {tmp_path / 'nope.yaml'}: no such inventory file\n"
