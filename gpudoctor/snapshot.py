"""Snapshots: the gathered Facts plus the raw transcript they came from, as one JSON file.

Replaying the transcript through today's gather code means old snapshots benefit from new parsers and checks.
"""

from __future__ import annotations

import json
import time

from gpudoctor.errors import InputError
from gpudoctor.gather import gather
from gpudoctor.host.replay import RecordingHost

SNAPSHOT_SCHEMA = "gpudoctor.snapshot/1"


def take(host, ctx) -> dict:
    """Gather through a recording host (and a recording Proxmox node); return the snapshot document."""
    from gpudoctor import __version__

    rec = RecordingHost(inner=host)
    prox = RecordingHost(inner=ctx.proxmox) if ctx.proxmox is not None else None
    if prox is not None:
        ctx.proxmox = prox
    facts = gather(rec, ctx)
    doc = {"schema": SNAPSHOT_SCHEMA, "gpudoctor_version": __version__, "created": time.time(),
           "host": ctx.name, "context": ctx.to_json(), "facts": facts, "transcript": rec.transcript}
    if prox is not None:
        doc["proxmox_transcript"] = prox.transcript
        ctx.proxmox = prox.inner
    return doc


MAX_BYTES = 256 << 20
_OPS = ("run", "read", "stat", "open", "listdir", "statvfs", "nvml")
_CORE = ("host", "driver", "devices", "cuda")


def refuse_live_flags(host_name, models, sglang_url) -> None:
    """A snapshot is judged as it was recorded: a flag that asks for more would be silently ignored — refused."""
    given = [f for f, v in (("--host", host_name), ("--model", models), ("--sglang-url", sglang_url)) if v]
    if given:
        raise InputError(f"{', '.join(given)} cannot be combined with --snapshot: a snapshot is judged as it was "
                         f"recorded (take a new one with `gpudoctor snapshot {' '.join(given)} ...`)")


def load(path: str) -> dict:
    """Read and validate a snapshot file (or a bare facts document); bad input is one line naming the file and the
    entry that is wrong. Read through gpudoctor.files.inputs (a regular file, at most MAX_BYTES, UTF-8, no NaN, bounded
    nesting), then checked against the schema: a snapshot gpudoctor cannot judge is refused before any diagnosis."""
    return load_document(path)


def validate(doc, path: str, *, require=_CORE) -> None:
    """Refuse (InputError) a document that is not a snapshot gpudoctor can judge: the wrong schema, fields of the
    wrong type, a transcript whose entries are not what a recording host writes, or nothing to judge at all."""
    from gpudoctor.files.inputs import brief

    def bad(msg: str):
        raise InputError(msg, path=path)

    if not isinstance(doc, dict) or doc.get("schema") != SNAPSHOT_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"not a gpudoctor snapshot (schema {brief(got, 60)}, expected {SNAPSHOT_SCHEMA!r})",
                         path=path, line=1)
    for key, types in (("host", str), ("created", (int, float)), ("gpudoctor_version", str), ("context", dict),
                       ("facts", dict), ("transcript", dict), ("proxmox_transcript", dict)):
        if key in doc and doc[key] is not None and (not isinstance(doc[key], types) or isinstance(doc[key], bool)):
            bad(f"snapshot field {key!r} must be {_type_name(types)}, got {type(doc[key]).__name__}")
    _validate_context(doc.get("context") or {}, bad)
    transcript = doc.get("transcript")
    if transcript is not None:
        if not transcript:
            bad("the snapshot's transcript is empty: there is nothing to judge")
        _validate_transcript(transcript, "transcript", bad)
        if doc.get("proxmox_transcript"):
            _validate_transcript(doc["proxmox_transcript"], "proxmox_transcript", bad)
        return
    facts = doc.get("facts")
    if not facts:
        bad("the snapshot has neither a transcript nor facts: there is nothing to judge")
    validate_facts(facts, path, "the snapshot's facts", require=require)


def validate_facts(facts, path: str, what: str = "the facts", require=_CORE) -> None:
    """A facts document (gather's output) that can be judged: the `require`d subsystems (at least one known
    subsystem when none is required), each a mapping, and meta (required with the core subsystems)."""
    from gpudoctor.gather import SUBSYSTEMS
    from gpudoctor.files.inputs import brief

    def bad(msg: str):
        raise InputError(msg, path=path)

    if not isinstance(facts, dict):
        bad(f"{what} must be a mapping")
    if require and not isinstance(facts.get("meta"), dict):
        bad(f"{what} have no meta section")
    for key, value in facts.items():
        if key == "schema":
            continue
        if key not in SUBSYSTEMS and key != "meta":
            bad(f"{what}: {brief(key, 40)} is not a subsystem gpudoctor gathers ({', '.join(SUBSYSTEMS)})")
        if not isinstance(value, dict):
            bad(f"{what}: {brief(key, 40)} must be a mapping, got {type(value).__name__}")
    missing = [k for k in require if k not in facts]
    if missing:
        bad(f"{what} lack {', '.join(missing)}: there is not enough to judge")
    if require and not any(facts[k] for k in require):
        bad(f"{what}: {', '.join(require)} are all empty: there is nothing to judge")
    if not any(k in SUBSYSTEMS for k in facts):
        bad(f"{what} hold no subsystem's facts: there is nothing to judge")
    meta = facts.setdefault("meta", {})
    if not isinstance(meta.get("context", {}), dict) or not isinstance(meta.get("timings", {}), dict):
        bad(f"{what}: meta.context and meta.timings must be mappings")
    _validate_context(meta.get("context") or {}, bad)


def load_document(path: str, *, require=_CORE, obeyed: bool = False) -> dict:
    """A snapshot document from a file that holds one, or a bare facts document (gpudoctor.facts/1) wrapped as one;
    validated, so anything that cannot be judged is refused here (InputError, exit 3). `require`: the subsystems a
    facts-only document must have (fix plans from a part, e.g. boundary facts)."""
    from gpudoctor.gather import FACTS_SCHEMA
    from gpudoctor.files.inputs import read_json

    doc = read_json(path, what="snapshot file", max_bytes=MAX_BYTES, obeyed=obeyed)
    if isinstance(doc, dict) and doc.get("schema") == FACTS_SCHEMA:
        validate_facts(doc, path, require=require)
        return {"schema": SNAPSHOT_SCHEMA, "host": (doc.get("meta") or {}).get("host"), "facts": doc, "_path": path}
    validate(doc, path, require=require)
    doc["_path"] = path
    return doc


def _type_name(types) -> str:
    names = {str: "a string", dict: "a mapping", list: "a list", int: "an integer", float: "a number", bool: "true/false"}
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _validate_context(c: dict, bad) -> None:
    shapes = {"name": (str,), "expect_gpus": (int,), "model_paths": (list,), "vmid": (int,), "policy": (dict,),
              "sglang_url": (str,), "timeout": (int, float), "lxc_config_dir": (str,), "pct": (list,),
              "proxmox": (str,)}
    for key, types in shapes.items():
        v = c.get(key)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            bad(f"snapshot context.{key} must be {_type_name(types)}, got {type(v).__name__}")
    for key in ("model_paths", "pct"):
        if any(not isinstance(x, str) for x in c.get(key) or []):
            bad(f"snapshot context.{key} must be a list of strings")
    t = c.get("timeout")
    if t is not None and not 0 < t <= 600:
        bad(f"snapshot context.timeout must be > 0 and <= 600 seconds, got {t!r}")


def _validate_transcript(transcript: dict, name: str, bad) -> None:
    """Every entry as a RecordingHost writes it: key ["op", ...] and a value of that operation's shape."""
    import base64
    import binascii

    from gpudoctor.files.inputs import brief

    for key, value in transcript.items():
        try:
            parts = json.loads(key)
        except ValueError:
            parts = None
        ok = isinstance(parts, list) and len(parts) in (2, 3) and parts[0] in _OPS
        if ok and len(parts) == 3:  # ["open", path, access]: a read-only open ("r") of a capability node
            ok = parts[0] == "open" and parts[2] in ("r", "rw")
        if not ok:
            bad(f"{name} entry {brief(key, 60)} is not a recorded operation (["
                f"{' | '.join(_OPS)}, argument])")
        op, arg = parts[0], parts[1]
        where = f"{name} entry {brief(key, 60)}"
        if op == "run":
            if not isinstance(arg, list) or not arg or not all(isinstance(a, str) for a in arg):
                bad(f"{where}: a command must be a list of strings")
        elif not isinstance(arg, str):
            bad(f"{where}: the path must be a string")
        if op == "run":
            ok = (isinstance(value, dict) and isinstance(value.get("argv"), list)
                  and (value.get("rc") is None or (isinstance(value.get("rc"), int) and not isinstance(value["rc"], bool)))
                  and isinstance(value.get("stdout", ""), str) and isinstance(value.get("stderr", ""), str)
                  and isinstance(value.get("timed_out", False), bool)
                  and isinstance(value.get("duration_s", 0.0), (int, float))
                  and (value.get("timeout_s") is None or isinstance(value.get("timeout_s"), (int, float)))
                  and set(value) <= {"argv", "rc", "stdout", "stderr", "duration_s", "timed_out", "timeout_s"})
            if ok and value.get("timed_out") and value.get("timeout_s") is None:
                ok = False
            if not ok:
                bad(f"{where}: a command result needs argv, rc (integer or null), stdout and stderr (strings)")
        elif op == "read":
            ok = (isinstance(value, dict) and isinstance(value.get("path"), str)
                  and (value.get("error") is None or isinstance(value.get("error"), str))
                  and (value.get("data_b64") is None or isinstance(value.get("data_b64"), str)))
            if ok and value.get("data_b64") is not None:
                try:
                    base64.b64decode(value["data_b64"], validate=True)
                except (binascii.Error, ValueError):
                    ok = False
            if not ok:
                bad(f"{where}: a file read needs path, and data_b64 (base64 text) or error")
        elif op == "stat":
            ints = ("mode", "uid", "gid", "major", "minor", "size")
            ok = (isinstance(value, dict) and isinstance(value.get("path"), str) and isinstance(value.get("exists"), bool)
                  and all(value.get(k) is None or (isinstance(value[k], int) and not isinstance(value[k], bool))
                          for k in ints)
                  and all(value.get(k) is None or isinstance(value[k], str) for k in ("kind", "target", "error"))
                  and (value.get("mtime") is None or isinstance(value["mtime"], (int, float)))
                  and set(value) <= {"path", "exists", "kind", *ints, "mtime", "target", "error"})
            if not ok:
                bad(f"{where}: a stat result needs path, exists (true/false) and integer mode/major/minor")
        elif op == "open":
            if not isinstance(value, str):
                bad(f"{where}: an open result is \"OK\" or an errno name")
        elif op == "listdir":
            if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(x, str) for x in value))):
                bad(f"{where}: a directory listing is a list of names or an errno name")
        elif op == "statvfs":
            if not isinstance(value, dict) or not all(isinstance(v, (int, float, str, bool)) for v in value.values()):
                bad(f"{where}: a statvfs result is a mapping of plain values")
        elif op == "nvml":  # NVML read in process (host/nvml.py, #33)
            ok = (isinstance(value, dict) and value.get("schema") == "gpudoctor.nvml/1"
                  and isinstance(value.get("system", {}), dict) and isinstance(value.get("devices", []), list)
                  and all(isinstance(d, dict) for d in value.get("devices", [])))
            if not ok:
                bad(f"{where}: an NVML answer is a gpudoctor.nvml/1 mapping with system (a mapping) and devices "
                    "(a list of mappings)")
