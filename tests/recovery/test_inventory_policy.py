"""The inventory's policy `recovery:` and `verify:` sections: read, validated at their line, kept as plain values."""

from __future__ import annotations

import pytest

from gpudoctor.errors import InventoryError
from gpudoctor.inventory import load_inventory
from gpudoctor.recovery.ladder import RecoveryPolicy
from gpudoctor.inventory_policy import from_inventory

HEAD = "hosts:\n  a: {address: 10.0.0.1}\npolicy:\n"


def _inv(tmp_path, body):
    p = tmp_path / "inventory.yaml"
    p.write_text(HEAD + body)
    return p


def test_sections_are_read(tmp_path):
    inv = load_inventory(str(_inv(tmp_path, "  recovery:\n    clean_cycles: 2\n    retry_s: 30\n"
                                            "  verify:\n    commands:\n      - [dcgmi, diag, -r, '2']\n")))
    assert from_inventory(inv) == RecoveryPolicy(clean_cycles=2, retry_s=30.0)
    assert inv.policy.verify == {"commands": [["dcgmi", "diag", "-r", "2"]]}
    assert inv.policy.verify_lines == {"commands": 8}
    assert inv.policy.as_dict()["recovery"] == {"clean_cycles": 2, "retry_s": 30}
    assert from_inventory(None) == RecoveryPolicy()


@pytest.mark.parametrize("body, line, msg", [
    ("  recovery:\n    clean_cycles: -1\n", 5, "policy.recovery.clean_cycles must be an integer >= 0"),
    ("  recovery:\n    clean_cycle: 1\n", 5, "unknown key 'clean_cycle'"),
    ("  recovery: [1]\n", 4, "policy.recovery must be a mapping"),
])
def test_bad_recovery_section_names_its_line(tmp_path, body, line, msg):
    with pytest.raises(InventoryError) as exc:
        load_inventory(str(_inv(tmp_path, body)))
    assert exc.value.line == line and msg in exc.value.message
