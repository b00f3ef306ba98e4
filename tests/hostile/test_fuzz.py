"""Fuzz the loaders: whatever the text, each answers with data or its one documented error — never anything else.

Hypothesis builds YAML-ish and JSON-ish text from the characters that matter to the parsers (brackets, anchors,
tags, quotes, indentation), plus arbitrary JSON values for the schema validators.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor.campaign import file as campaign
from gpudoctor.bench.records.results import check_record
from gpudoctor.errors import ConfigError, InputError, InventoryError
from gpudoctor.files.inputs import brief, parse_json
from gpudoctor.inventory import parse_inventory
from gpudoctor.snapshot import validate, validate_facts
from gpudoctor.term import printable
from gpudoctor.files.yamlload import load

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

def _tokens(*parts) -> st.SearchStrategy:
    """Text made of these pieces (single characters and whole tokens), joined."""
    return st.lists(st.sampled_from([p for group in parts for p in group]), max_size=60).map("".join)


YAMLISH = _tokens(list("ab01:- \n\t[]{},&*!|>'\"#%@`?<=.~\\\x00\x1b\u202e"),
                  ["!!python/object:os.system", "<<: *a", "&a ", "*a", "!ip ", "!!binary ", "hosts:\n", "  ct200:\n",
                   "    address: ", ".nan", ".inf", "---\n", "\n  ", "\n    "])
JSONISH = _tokens(list('{}[]",:0123456789.eE-+ \n\\tnulfasr'), ["NaN", "Infinity", "\\u00", '"schema"'])
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                      lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                      max_leaves=20)


@FAST
@given(YAMLISH)
def test_located_yaml_loader_gives_data_or_one_config_error(text):
    try:
        doc = load(text, "f.yaml")
    except ConfigError as exc:
        assert exc.path == "f.yaml" and "\n" not in exc.one_line()
        return
    json.dumps(doc.data)  # plain data only: no Python objects, no dates, nothing a tag could build


@FAST
@given(YAMLISH)
def test_inventory_parser_gives_an_inventory_or_one_inventory_error(text):
    try:
        parse_inventory(text, "inventory.yaml")
    except InventoryError as exc:
        assert "\n" not in exc.one_line() and len(exc.one_line()) < 1000


@FAST
@given(YAMLISH)
def test_campaign_loader_gives_a_campaign_or_one_config_error(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("c") / "c.yaml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(ConfigError):
        campaign.load(str(p))  # none of these texts is a whole campaign


@FAST
@given(JSONISH)
def test_json_reader_gives_data_or_one_input_error(text):
    try:
        parse_json(text, "s.json")
    except InputError as exc:
        assert exc.path == "s.json"


@FAST
@given(VALUES)
def test_snapshot_validation_refuses_or_accepts_never_crashes(value):
    doc = {"schema": "gpudoctor.snapshot/1", "transcript": value} if not isinstance(value, dict) else {
        "schema": "gpudoctor.snapshot/1", **value}
    for d in (value, doc, {"schema": "gpudoctor.snapshot/1", "facts": value}):
        try:
            validate(d, "s.json")
        except InputError:
            pass
    try:
        validate_facts(value, "f.json")
    except InputError:
        pass


@FAST
@given(VALUES)
def test_result_record_check_refuses_or_accepts_never_crashes(value):
    try:
        check_record(value, "results.jsonl", 1)
    except InputError as exc:
        assert exc.line == 1


@FAST
@given(st.text())
def test_printable_leaves_no_control_character(s):
    out = printable(s)
    assert all(ch.isprintable() for ch in out)
    assert "\n" not in out
    if s.isascii() and s.isprintable():
        assert out == s
    assert all(ch.isprintable() or ch in "\n\t" for ch in printable(s, keep_newlines=True))


@FAST
@given(st.text(min_size=0, max_size=50_000))
def test_brief_is_short(s):
    assert len(brief(s)) < 140
