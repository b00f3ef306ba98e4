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


def load(path: str) -> dict:
    """Read and validate a snapshot file; bad input is one line naming the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise InputError("no such snapshot file", path=path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", path=path, line=exc.lineno) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read snapshot: {exc}", path=path) from None
    if not isinstance(doc, dict) or doc.get("schema") != SNAPSHOT_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"not a gpudoctor snapshot (schema {got!r}, expected {SNAPSHOT_SCHEMA!r})", path=path, line=1)
    if not isinstance(doc.get("facts"), dict) and not isinstance(doc.get("transcript"), dict):
        raise InputError("snapshot has neither facts nor transcript", path=path, line=1)
    return doc


def facts_of(doc: dict, regather: bool = True) -> dict:
    """The snapshot's facts: re-gathered from its transcript through today's code when it has one."""
    if not regather or not isinstance(doc.get("transcript"), dict):
        return doc["facts"]
    from gpudoctor.target import open_target

    return open_target(snapshot=doc, search=False).facts()
