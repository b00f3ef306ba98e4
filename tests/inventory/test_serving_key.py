"""hosts.NAME.serving: the endpoint and model the active verification's serving smoke uses (#31)."""

from __future__ import annotations

import pytest

from gpudoctor.errors import InventoryError
from gpudoctor.inventory import Serving, parse_inventory


def host(serving: str):
    return parse_inventory(f"hosts:\n  a:\n    address: local\n    serving: {serving}\n", path="inv.yaml").host("a")


def test_serving_is_read_with_its_defaults():
    assert host("{url: 'http://127.0.0.1:30000/', model: Qwen/Qwen3-8B}").serving == Serving(
        "http://127.0.0.1:30000", "Qwen/Qwen3-8B", "completions")
    assert host("{url: 'https://x:8000', model: m, api: native}").serving.api == "native"
    inv = parse_inventory("hosts:\n  a:\n    address: local\n", path="inv.yaml")
    assert inv.host("a").serving is None and inv.to_json()["hosts"]["a"]["serving"] is None


@pytest.mark.parametrize("spec, words", [
    ("{url: 'ftp://x', model: m}", "host a: serving.url must be an http:// or https:// URL"),
    ("{url: 'http://x'}", "host a: serving needs model:"),
    ("{model: m}", "host a: serving needs url:"),
    ("{url: 'http://x', model: m, api: grpc}", "serving.api must be one of completions, chat, native"),
    ("{url: 'http://x', model: m, port: 1}", "unknown key 'port' in host a: serving"),
    ("http://x", "host a: serving"),
])
def test_bad_serving_is_one_line_at_its_line(spec, words):
    with pytest.raises(InventoryError) as e:
        host(spec)
    assert e.value.one_line().startswith("inv.yaml:4: ") and words in e.value.one_line(), e.value.one_line()
