"""Bad input to `model verify` / `model stage`: one line naming the path, exit 3, nothing written."""

from __future__ import annotations

import os

import pytest

from .conftest import run_gpudoctor
from .modelfiles import write_hf_cache, write_model


@pytest.fixture
def world(tmp_path):
    write_model(tmp_path / "m", shards=2)
    write_hf_cache(tmp_path / "hub", shards=2)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    (tmp_path / "etc" / "notes.txt").write_text("not a model\n")
    return tmp_path


CASES = [
    # (argv template, a fragment of the one line)
    (["model", "verify", "{t}/nope"], "{t}/nope: no such directory"),
    (["model", "verify", "{t}/afile"], "{t}/afile: not a directory"),
    (["model", "verify", "{t}/etc"], "{t}/etc: not a model directory"),
    (["model", "verify", "{t}/hub"], "is a Hugging Face cache root; name one repo folder: models--acme--tiny"),
    (["model", "verify", "--hash", "{t}/m"], "--hash: nothing to compare against"),
    (["model", "stage", "--to", "{t}/dst"], "give exactly one of --from (a model directory) or --from-hub"),
    (["model", "stage", "--from", "{t}/m", "--from-hub", "a/b", "--to", "{t}/dst"], "give exactly one of"),
    (["model", "stage", "--from", "{t}/nope", "--to", "{t}/dst"], "{t}/nope: --from: no such directory"),
    (["model", "stage", "--from", "{t}/etc", "--to", "{t}/dst"], "--from: not a model directory"),
    (["model", "stage", "--from", "{t}/m", "--to", "{t}/m/sub"], "--to must not be the source or lie inside it"),
    (["model", "stage", "--from", "{t}/m", "--to", "{t}"], "--to must not be the source or lie inside it"),
    (["model", "stage", "--from", "{t}/m", "--to", "{t}/afile"], "{t}/afile: --to exists and is not a directory"),
    (["model", "stage", "--from", "{t}/m", "--to", "{t}/hub/models--acme--tiny"], "is a Hugging Face cache folder"),
    (["model", "stage", "--from", "{t}/hub/models--acme--tiny", "--revision", "v9", "--to", "{t}/dst"],
     "ref_missing refs/v9"),
]


@pytest.mark.parametrize("argv,fragment", CASES, ids=[" ".join(c[0][:3]) + f"#{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_one_line_exit_3(cli, world, argv, fragment):
    before = sorted(os.listdir(world))
    r = cli(*[a.format(t=world) for a in argv])
    assert r.code == 3, (r.out, r.err)
    assert r.err.count("\n") == 1 and r.err.startswith("gpudoctor: "), r.err
    assert fragment.format(t=world) in r.err
    assert "Traceback" not in r.err + r.out
    assert sorted(os.listdir(world)) == before  # nothing created (no dst)


@pytest.mark.parametrize("argv", [
    ["model", "stage", "--from", "{t}/m", "--to", "{t}/dst", "--jobs", "0"],
    ["model", "stage", "--from", "{t}/m", "--to", "{t}/dst", "--jobs", "many"],
    ["model", "verify"],
    ["model", "verify", "{t}/m", "--no-such-flag"],
])
def test_bad_flags_exit_3_without_traceback(cli, world, argv):
    r = cli(*[a.format(t=world) for a in argv])
    assert r.code == 3 and "Traceback" not in r.err and "Error:" in r.err
    assert not (world / "dst").exists()


def test_real_process_bad_input_one_line(world):
    p = run_gpudoctor("model", "verify", world / "etc")
    assert p.returncode == 3 and p.stdout == ""
    assert p.stderr == f"gpudoctor: {world}/etc: not a model directory (no config.json, no weights, no index)\n"
