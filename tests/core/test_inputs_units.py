"""files/inputs.py, the one reader of input files and values (#48 item 6: mutants no test killed, among them a bool
accepted as a number). Each test pins one rule by its behaviour and its message."""

from __future__ import annotations

import json
import math
import os

import pytest

from gpudoctor.errors import InputError
from gpudoctor import options
from gpudoctor.files import inputs


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_a_number(value):
    with pytest.raises(InputError, match=r"x must be a number, got (True|False)"):
        inputs.number(value, "x")
    with pytest.raises(InputError, match="must be an integer"):
        inputs.number(value, "x", integer=True)


def test_number_ranges_and_kinds():
    assert inputs.number(1, "x", lo=1, hi=5) == 1 and inputs.number(5.0, "x", lo=1, hi=5) == 5.0
    assert inputs.number(7, "x", integer=True) == 7 and inputs.number(0.5, "x") == 0.5
    with pytest.raises(InputError, match=r"^x must be a number > 1 and <= 5, got 1$"):
        inputs.number(1, "x", lo=1, hi=5, lo_open=True)
    with pytest.raises(InputError, match=r"^x must be a number >= 1 and <= 5, got 0.5$"):
        inputs.number(0.5, "x", lo=1, hi=5)
    with pytest.raises(InputError, match=r"^x must be a number <= 2.5, got 3$"):
        inputs.number(3, "x", hi=2.5)
    with pytest.raises(InputError, match=r"^n must be an integer >= 0, got 1.5$"):
        inputs.number(1.5, "n", lo=0, integer=True)
    for bad in (math.nan, math.inf, -math.inf, "3", None):
        with pytest.raises(InputError):
            inputs.number(bad, "x")
    with pytest.raises(InputError) as e:
        inputs.number("3", "x", path="/f", line=4)
    assert e.value.path == "/f" and e.value.line == 4


def test_brief_cuts_with_a_count():
    assert inputs.brief("ab") == "'ab'"
    long = "y" * 100
    assert inputs.brief(long) == repr(long)[:80] + f"… ({len(repr(long)) - 80} more characters)"
    assert inputs.brief("z" * 78) == repr("z" * 78)  # exactly 80 characters: whole


@pytest.mark.parametrize("url", ["http://h", "https://h:8443/x", "http://127.0.0.1:30000/v1"])
def test_http_url_accepts(url):
    assert inputs.http_url(url, "--url") == url


@pytest.mark.parametrize("url,msg", [("", "must be an http"), (None, "must be an http"), ("ftp://h", "with a host"),
                                     ("http://", "with a host"), ("http://h/a b", "with a host"),
                                     ("http://h:99999", "not a valid URL"), ("http://h/\x07", "with a host")])
def test_http_url_refuses(url, msg):
    with pytest.raises(InputError, match=msg):
        inputs.http_url(url, "--url")


def test_read_bytes_refuses_what_is_not_a_regular_file_and_what_is_too_big(tmp_path):
    with pytest.raises(InputError, match="no such inventory") as e:
        inputs.read_bytes(tmp_path / "none", what="inventory")
    assert e.value.path == str(tmp_path / "none")
    with pytest.raises(InputError, match="it is a directory, not a regular file"):
        inputs.read_bytes(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="it is a FIFO"):
        inputs.read_bytes(tmp_path / "fifo")
    (tmp_path / "f").write_bytes(b"0123456789")
    assert inputs.read_bytes(tmp_path / "f", max_bytes=10) == b"0123456789"
    with pytest.raises(InputError, match="file is 10 bytes, larger than the 9 bytes gpudoctor reads"):
        inputs.read_bytes(tmp_path / "f", max_bytes=9)
    assert inputs.read_bytes(tmp_path / "f", max_bytes=4, tail=True) == b"6789"
    big = tmp_path / "big"
    big.write_bytes(b"x" * (2 * inputs.MiB))
    with pytest.raises(InputError, match=r"2\.0 MiB, larger than the 1\.0 MiB"):
        inputs.read_bytes(big, max_bytes=inputs.MiB)
    assert len(inputs.read_bytes(big, max_bytes=3 * inputs.MiB)) == 2 * inputs.MiB


def test_a_character_device_is_refused_before_it_is_opened():
    with pytest.raises(InputError, match="it is a character device"):
        inputs.read_bytes("/dev/null")


def test_decode_names_the_line_of_a_bad_byte_and_drops_a_bom():
    assert inputs.decode("\ufeffa".encode(), "/f") == "a"
    with pytest.raises(InputError, match=r"byte 0xff at offset 5") as e:
        inputs.decode(b"a\nb\nc\xff", "/f")
    assert e.value.line == 3


def test_json_errors_name_their_line_and_depth_is_bounded(tmp_path):
    with pytest.raises(InputError, match=r"not valid JSON: .* \(column \d+\)") as e:
        inputs.parse_json('{\n"a": 1,\n}', "/f")
    try:  # the decoder's own line: 3 (the "}") before Python 3.13, 2 (the trailing comma) from 3.13 on
        json.loads('{\n"a": 1,\n}')
    except json.JSONDecodeError as exc:
        assert e.value.line == exc.lineno and e.value.line in (2, 3)
    with pytest.raises(InputError, match="NaN is not a JSON number"):
        inputs.parse_json('[NaN]', "/f")
    with pytest.raises(InputError, match="nests deeper than 3 levels") as e:
        inputs.parse_json('[[\n[["x"]]]]', "/f", max_depth=3)
    assert e.value.line == 2
    assert inputs.parse_json('[["[[[[", {"a": "\\"[[["}]]', "/f", max_depth=3) == [["[[[[", {"a": '"[[['}]]
    assert inputs.json_depth_exceeds("[[[]]]", 3) is None and inputs.json_depth_exceeds("[[[[]]]]", 3) == 3
    assert inputs.json_depth_exceeds("[]" * 5, 3) is None  # many, never nested
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n[1]\n')
    with pytest.raises(InputError, match="each line must be a JSON object") as e:
        inputs.read_jsonl(p)
    assert e.value.line == 3
    assert inputs.read_jsonl(p, objects=False) == [(1, {"a": 1}), (3, [1])]
    p.write_text('{"a": 1}\n{bad\n')
    with pytest.raises(InputError, match="a record is not valid JSON") as e:
        inputs.read_jsonl(p, item="a record")
    assert e.value.line == 2
    (tmp_path / "d.json").write_text('{"k": [1, 2]}')
    assert inputs.read_json(tmp_path / "d.json") == {"k": [1, 2]}


def test_output_file_and_dir_are_checked_before_any_work(tmp_path):
    assert inputs.output_file("-") == "-" and inputs.output_file("") == ""
    assert inputs.output_file(tmp_path / "new.json") == str(tmp_path / "new.json")
    with pytest.raises(InputError, match="report is a directory"):
        inputs.output_file(tmp_path, "report")
    with pytest.raises(InputError, match="its directory .*/missing does not exist"):
        inputs.output_file(tmp_path / "missing" / "f")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="it exists and is not a regular file"):
        inputs.output_file(tmp_path / "fifo")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="--out exists and is not a directory"):
        inputs.output_dir(tmp_path / "file", "--out")
    with pytest.raises(InputError, match="cannot create --out: .*/file is not a directory"):
        inputs.output_dir(tmp_path / "file" / "sub" / "d", "--out")
    with pytest.raises(InputError, match="must not be empty"):
        inputs.output_dir("", "--out")
    assert inputs.output_dir(tmp_path / "a" / "b") == str(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # nothing created


def test_a_group_writable_out_directory_is_refused(tmp_path):
    """--out in a directory root's group does not own but can write: another user could swap what root writes."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chown(d, 0, 65534)
    os.chmod(d, 0o775)
    with pytest.raises(InputError, match="writable by (others|group)"):
        inputs.output_dir(d, "--out")
    os.chown(d, 0, 0)
    with pytest.raises(InputError, match="writable by group 0"):  # the one rule: whatever the group (security.md)
        inputs.output_dir(d, "--out")
    os.chmod(d, 0o755)
    assert inputs.output_dir(d, "--out") == str(d)


def test_the_click_types_refuse_nan_and_range():
    import click

    t = options.seconds(0, 10)
    assert t.convert("2.5", None, None) == 2.5
    for bad in ("nan", "inf", "11", "-1"):
        with pytest.raises(click.BadParameter):
            t.convert(bad, None, None)
    t = options.finite(1, 2, lo_open=True)
    with pytest.raises(click.BadParameter):
        t.convert("1", None, None)


def test_defaults_and_sizes(tmp_path):
    assert inputs.MiB == 1048576 and inputs.DEFAULT_MAX_BYTES == 16 * 1048576
    assert inputs._size(1048576) == "1.0 MiB" and inputs._size(1048575) == "1048575 bytes"
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(16 * 1048576 + 1)
    with pytest.raises(InputError, match=r"^.*file is 16\.0 MiB, larger than the 16\.0 MiB gpudoctor reads$"):
        inputs.read_bytes(big)
    deep = "[" * 65 + "]" * 65
    with pytest.raises(InputError, match="^.*file nests deeper than 64 levels$"):
        inputs.parse_json(deep, "/f")
    assert inputs.parse_json("[" * 64 + "]" * 64, "/f") is not None
    (tmp_path / "d.json").write_text(deep)
    with pytest.raises(InputError, match="nests deeper than 64"):
        inputs.read_json(tmp_path / "d.json")
    with pytest.raises(InputError, match="^.*file is not UTF-8 text"):
        inputs.read_text(_bad(tmp_path))
    (tmp_path / "x.jsonl").write_text("[" * 65 + "]" * 65 + "\n")
    with pytest.raises(InputError, match="a line of the file nests deeper than 64"):
        inputs.read_jsonl(tmp_path / "x.jsonl", objects=False)


def _bad(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_bytes(b"\xff")
    return p


def test_a_path_through_a_file_cannot_be_read(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="^.*cannot read file: .* not a directory$"):
        inputs.read_bytes(tmp_path / "f" / "x")


def test_reads_leave_no_descriptor_open(tmp_path):
    (tmp_path / "f").write_text("x")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        inputs.read_bytes(tmp_path / "f")
    assert len(os.listdir("/proc/self/fd")) == before


def test_as_root_an_input_another_user_can_change_is_refused(tmp_path):
    """trusted(): the file and every directory above it root's and writable by no other user (sshd's StrictModes)."""
    from tests import needs

    needs.root()
    d = tmp_path / "conf"
    d.mkdir()
    f = d / "inventory.yaml"
    f.write_text("hosts: {}\n")
    assert inputs.read_bytes(f, obeyed=True) == b"hosts: {}\n"  # root's
    assert inputs.read_bytes(d / "missing.yaml", obeyed=True, missing_ok=True) is None
    os.chown(f, 65534, 65534)
    with pytest.raises(InputError, match="^.*refusing this file as root: .*another user could change what root does") as e:
        inputs.read_bytes(f, obeyed=True)
    assert e.value.path == str(f)
    with pytest.raises(InputError, match="refusing this inventory as root"):
        inputs.read_bytes(f, obeyed=True, what="inventory")
    os.chown(f, 0, 0)
    os.chmod(d, 0o777)
    with pytest.raises(InputError, match="refusing this file as root"):
        inputs.read_bytes(f, obeyed=True)


def test_depth_scan_skips_strings_and_escapes_and_counts_both_brackets():
    f = inputs.json_depth_exceeds
    assert f("[X[X]]", 1) == 2  # only brackets count
    assert f("[[]X[]]", 1) == 1
    assert f('["\\\\", [[]]]', 2) == 8  # an escaped backslash ends before the quote: the string closes there
    assert f('["\\"[[[[", []]', 2) is None  # an escaped quote does not end the string
    assert f('["a", "[[[["]', 1) is None and f('[{"a": [1]}]', 2) == 7
    assert f("{{{}}}", 2) == 2 and f("[]{}[]", 1) is None and f("[[]][[]]", 2) is None
    assert f("{[", 1) == 1  # "{" counts in the quick check too


def test_more_refusals(tmp_path):
    with pytest.raises(InputError, match=r"^--url must be an http:// or https:// URL, got ''$"):
        inputs.http_url("", "--url")
    with pytest.raises(InputError, match=r"got 3$"):
        inputs.http_url(3, "--url")
    (tmp_path / "j.jsonl").write_text("[1]\n")
    with pytest.raises(InputError, match=r"^.*: each line must be a JSON object$"):
        inputs.read_jsonl(tmp_path / "j.jsonl")
    with pytest.raises(InputError, match="^.*output file is a directory$"):
        inputs.output_file(tmp_path)
    with pytest.raises(InputError, match="^.*output directory exists and is not a directory$"):
        inputs.output_dir(tmp_path / "j.jsonl")
    with pytest.raises(InputError, match="^.*no such file$"):
        inputs.read_text(tmp_path / "none")
    with pytest.raises(InputError, match="^.*no such file$"):
        inputs.read_json(tmp_path / "none")
    with pytest.raises(InputError, match="^.*no such file$"):
        inputs.read_jsonl(tmp_path / "none")
    with pytest.raises(InputError, match=r"^.*: file is not valid JSON"):
        inputs.parse_json("{", "/f")
    with pytest.raises(InputError, match=r"^.*: file is not UTF-8"):
        inputs.decode(b"\xff", "/f")


def test_tail_reads_the_last_bytes_of_a_long_file(tmp_path):
    p = tmp_path / "log"
    p.write_bytes(b"a" * inputs.MiB + b"b" * 10)
    assert inputs.read_bytes(p, max_bytes=inputs.MiB + 5, tail=True) == b"a" * (inputs.MiB - 5) + b"b" * 10
    assert inputs.read_bytes(p, max_bytes=inputs.MiB + 10) == b"a" * inputs.MiB + b"b" * 10
    assert len(inputs.read_bytes(p)) == inputs.MiB + 10


def test_the_click_types_defaults():
    import click

    t = options.seconds()
    assert t.convert("0", None, None) == 0 and t.convert("86400", None, None) == 86400
    with pytest.raises(click.BadParameter):
        t.convert("86400.5", None, None)
    assert options.finite(0, 1).convert("0", None, None) == 0 and options.finite(0, 1).convert("1", None, None) == 1
