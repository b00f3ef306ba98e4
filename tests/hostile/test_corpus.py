"""Run every case of the hostile corpus (cases.py) through the real CLI, in a fresh directory each.

Each run must: finish (a hang is a failure: TIMEOUT_S), print no traceback, put no raw control byte on the terminal
(ESC, CR, BS, C1, ... — newline and tab only), exit with the case's code, give ONE error line naming the input when
it is bad input (exit 3), never echo a huge value whole, and leave its directory exactly as it was (nothing
half-written, no lock file, no output directory, no server started).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.childenv import pythonpath
from tests.console import drain

from tests.hostile.cases import CORPUS, all_cases

ROOT = Path(__file__).resolve().parents[2]
OK_SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "h200-healthy.json"
FAIL_SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "h200-uvm-blocked.json"
PROC_DEVICES = ROOT / "tests" / "fixtures" / "proxmox" / "proc-devices-uvm511.txt"
TIMEOUT_S = 60
HOSTILE = "ct\x1b[2J\x1b]0;owned\x07\r\x08\u202e\x9b31m\nFAKE ok"
# What a case must never make happen: code from the input run (a python tag), a server started. The server marker is
# written under the case's own HOME (its run directory), so test runs that share a machine never see each other's.
PWNED = Path("/tmp/gpudoctor-hostile-pwned")
SERVER_MARK = "gpudoctor-hostile-server-started"
# C0 controls except \t and \n, DEL, and C1 controls as UTF-8 (\xc2\x80-\xc2\x9f)
RAW_CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")


def _safetensors(header: dict, data_len: int, raw_header: bytes | None = None) -> bytes:
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"\0" * data_len


def _model_dir(t: Path, st: bytes) -> Path:
    d = t / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "num_attention_heads": 8, "hidden_size": 512,
                                               "num_hidden_layers": 2}))
    (d / "model.safetensors").write_bytes(st)
    return d


def _hostile_snapshot(t: Path, src: Path) -> Path:
    doc = json.loads(src.read_text())
    doc["host"] = HOSTILE
    doc.setdefault("context", {})["name"] = HOSTILE
    p = t / "hostile.json"
    p.write_text(json.dumps(doc))
    return p


def _fifo(t: Path, name: str = "input") -> Path:
    p = t / name
    os.mkfifo(p)
    return p


def _make_fifo_results(t: Path) -> Path:
    (t / "run").mkdir()
    _fifo(t / "run", "results.jsonl")
    return t / "run"


def _deep_json(t: Path) -> Path:
    p = t / "deep.json"
    p.write_text('{"schema": "gpudoctor.snapshot/1", "transcript": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return p


def _huge_schema(t: Path) -> Path:
    p = t / "huge.json"
    p.write_text(json.dumps({"schema": "x" * 20_000, "facts": {}}))
    return p


def _huge_conf(t: Path) -> Path:
    p = t / "200.conf"
    p.write_text("arch: amd64\nlxc.mount.entry: " + "x" * 20_000 + "\n")
    return p


def _cfg_zero_heads(t: Path) -> Path:
    d = t / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_attention_heads": 0,
                                               "hidden_size": 4096, "num_hidden_layers": 32}))
    return d


def _dir(t: Path) -> Path:
    (t / "input.json").mkdir()
    return t / "input.json"


F32 = {"dtype": "F32", "shape": [2]}
MAKERS = {
    "fifo": _fifo,
    "dir": _dir,
    "deep-json": _deep_json,
    "huge-schema-json": _huge_schema,
    "huge-conf": _huge_conf,
    "escape-host": lambda t: _hostile_snapshot(t, OK_SNAPSHOT),
    "escape-fail": lambda t: _hostile_snapshot(t, FAIL_SNAPSHOT),
    "fifo-results": _make_fifo_results,
    "cfg-zero-heads": _cfg_zero_heads,
    # two tensors whose bytes overlap; the file size is exactly 8 + N + the last end (what a size check accepts)
    "st-overlap": lambda t: _model_dir(t, _safetensors({"a": {**F32, "data_offsets": [0, 8]},
                                                        "b": {**F32, "data_offsets": [4, 12]}}, 12)),
    "st-float": lambda t: _model_dir(t, _safetensors({"a": {**F32, "data_offsets": [0, 8.5]}}, 8)),
    "st-hole": lambda t: _model_dir(t, _safetensors({"a": {**F32, "data_offsets": [0, 8]},
                                                     "b": {**F32, "data_offsets": [12, 20]}}, 20)),
    "st-deep": lambda t: _model_dir(t, _safetensors({}, 0, raw_header=b'{"a": ' + b"[" * 50_000 + b"]" * 50_000
                                                    + b"}")),
}


def _tree(root: Path) -> dict[str, str]:
    """Every path under root with what it is (a file's sha256): the directory's state, to compare after the run."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_fifo():
            out[rel] = "fifo"
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _env(t: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDOCTOR_")}
    env.update(HOME=str(t), XDG_CONFIG_HOME=str(t / ".config"), PYTHONPATH=pythonpath(env={}), COLUMNS="120",
               STATE_DIRECTORY=str(t / ".state"),  # gate --slurm/--npd keep their recovery ladder here
               PATH="/usr/bin:/bin")  # no scontrol, no nvidia-smi: nothing outside the case answers
    return env


CASES = all_cases()


def test_the_corpus_covers_every_input_kind():
    kinds = {c.id.split("-")[0] for c in CASES}
    assert {"inventory", "campaign", "snapshot", "results", "proxmox", "model", "sglang", "flag", "host"} <= kinds
    assert len(CASES) >= 150


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path):
    t = tmp_path / "run-dir"
    t.mkdir()
    for rel, data in case.setup.items():
        (t / rel).parent.mkdir(parents=True, exist_ok=True)
        (t / rel).write_bytes(data)
    made = MAKERS[case.make](t) if case.make else None
    subst = {"{C}": str(CORPUS), "{T}": str(t), "{OK}": str(OK_SNAPSHOT), "{DEV}": str(PROC_DEVICES),
             "{MADE}": str(made)}
    argv = []
    for a in case.argv:
        for k, v in subst.items():
            a = a.replace(k, v)
        argv.append(a)
    markers = (PWNED, t / SERVER_MARK)
    for m in markers:
        m.unlink(missing_ok=True)
    before = _tree(t)
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "gpudoctor", *argv], cwd=t, env=_env(t), capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpudoctor {' '.join(argv)[:200]} hung for {TIMEOUT_S} s")
    took = time.monotonic() - t0
    out, err = p.stdout, p.stderr
    shown = (out + err).decode("utf-8", "replace")[-2000:]
    assert b"Traceback" not in out + err, shown
    raw = RAW_CONTROL.search(out + err)
    assert raw is None, f"raw control byte {raw.group()!r} reached the terminal: {shown!r}"
    want = case.rc if isinstance(case.rc, tuple) else (case.rc,)
    assert p.returncode in want, f"exit {p.returncode}, expected {case.rc}: {shown}"
    if case.one_line_on == "json":  # gate --json: the document says it could not judge
        doc = json.loads(out)
        assert doc["pass"] is False and doc["error"] and doc["exit_code"] == 3, doc
    elif case.rc == 3 or (case.one_line_on == "stdout" and p.returncode == 2):
        stream = (out if case.one_line_on == "stdout" else err).decode("utf-8", "replace")
        lines = stream.strip().splitlines()
        assert len(lines) == 1, f"bad input must give exactly one line, got: {stream!r}"
        assert len(lines[0]) < 1000, f"an error must not echo a huge value whole ({len(lines[0])} characters)"
        if case.err:
            assert case.err in lines[0], lines[0]
    assert _tree(t) == before, "the run left something behind (half-written output, a lock, a directory)"
    for m in markers:
        assert not m.exists(), f"{m} exists: the input made gpudoctor run something"
    assert took < TIMEOUT_S


def test_a_bare_escape_in_any_summary_line_is_escaped_on_a_real_terminal(tmp_path):
    """On a TTY rich writes its own colours; a hostile host name in the summary line must still arrive escaped."""
    import pty

    snap = _hostile_snapshot(tmp_path, FAIL_SNAPSHOT)
    pid, fd = pty.fork()
    if pid == 0:  # the child: the real CLI, its stdout a terminal
        os.environ.update(_env(tmp_path))
        os.execv(sys.executable, [sys.executable, "-m", "gpudoctor", "check", "--snapshot", str(snap)])
    text = drain(fd, TIMEOUT_S)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 2, text[-500:]
    assert b"\\x1b[2J" in text and b"\\x1b]0;owned" in text  # shown, escaped
    assert b"\x1b[2J" not in text and b"\x1b]0;" not in text and b"\x07" not in text and b"\x08" not in text
    assert b"\xe2\x80\xae" not in text  # U+202E RIGHT-TO-LEFT OVERRIDE
    # every ESC left is one of rich's own SGR colour sequences
    assert re.sub(rb"\x1b\[[0-9;]*m", b"", text).count(b"\x1b") == 0


def test_nothing_is_left_of_a_refused_campaign(tmp_path):
    """A campaign whose model does not exist: exit 3 before any server, gate or lock; the out dir never appears."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "run", str(CORPUS / "campaign/missing-model.yaml"),
                        "--out", str(out)], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=tmp_path,
                       env=_env(tmp_path))
    assert p.returncode == 3 and "does not exist" in p.stderr and "no server is started" in p.stderr, p.stderr
    assert not out.exists()
    shutil.rmtree(tmp_path / ".config", ignore_errors=True)
