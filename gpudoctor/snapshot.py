"""Snapshots: the gathered Facts plus the raw transcript they came from, as one JSON file.

Replaying the transcript through today's gather code means old snapshots benefit from new parsers and checks.
"""

from __future__ import annotations

import json
import time

from gpudoctor.errors import InputError
from gpudoctor.gather import gather
from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host
from gpudoctor.host.replay import RecordingHost, ReplayHost

SNAPSHOT_SCHEMA = "gpudoctor.snapshot/1"


def take(host: Host, ctx: GatherContext) -> dict:
    """Gather through a recording host; return the snapshot document."""
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
    c = dict(doc.get("context") or {})
    ctx = GatherContext(name=doc.get("host", "snapshot"), expect_gpus=c.get("expect_gpus"),
                        model_paths=c.get("model_paths") or [], vmid=c.get("vmid"), policy=c.get("policy") or {},
                        sglang_url=c.get("sglang_url"), timeout=c.get("timeout") or 10.0,
                        units=list(c.get("units") or []), cdi_dirs=list(c.get("cdi_dirs") or []),
                        oci_state_dirs=list(c.get("oci_state_dirs") or []))
    if c.get("lxc_config_dir"):
        ctx.lxc_config_dir = c["lxc_config_dir"]
    if c.get("pct"):
        ctx.pct = list(c["pct"])
    if isinstance(doc.get("proxmox_transcript"), dict):
        ctx.proxmox = ReplayHost(name=c.get("proxmox") or "proxmox", transcript=doc["proxmox_transcript"])
    facts = gather(ReplayHost(name=ctx.name, transcript=doc["transcript"]), ctx)
    facts["meta"]["timings"] = (doc.get("facts") or {}).get("meta", {}).get("timings", facts["meta"]["timings"])
    facts["meta"]["replayed_from"] = doc.get("created")
    return facts
