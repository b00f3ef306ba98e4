"""The remedy registry: every remedy gpudoctor knows, by id, loaded lazily.

A remedy module defines one class derived from gpudoctor.remedy.Remedy; add it here as "id": "module:Class".
"""

from __future__ import annotations

import fnmatch
import importlib

REMEDIES: dict[str, str] = {
    "lxc.cgroup_allow": "gpudoctor.remedies.lxc_cgroup:LxcCgroupAllow",
}


def get(remedy_id: str):
    """A fresh instance of one remedy (KeyError names the known ids)."""
    try:
        target = REMEDIES[remedy_id]
    except KeyError:
        raise KeyError(f"unknown remedy {remedy_id!r}; known: {', '.join(sorted(REMEDIES))}") from None
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)()


def all_remedies(only: list[str] | None = None) -> list:
    """Fresh instances of every remedy (or of those named in `only`), in registry order."""
    return [get(rid) for rid in REMEDIES if only is None or rid in only]


def for_finding(finding_id: str) -> list[str]:
    """Ids of the remedies whose `fixes` patterns cover a finding id."""
    return [r.id for r in all_remedies() if any(fnmatch.fnmatchcase(finding_id, p) for p in r.fixes)]
