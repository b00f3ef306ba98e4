"""Small helpers the host remedies share: the checks' own verdicts over facts, where a change applies, what the
target may do, and re-gathering one subsystem's facts for verify()."""

from __future__ import annotations

import os
import secrets

from gpudoctor.findings import Finding, Status, worst


def bad(findings) -> list[Finding]:
    """The findings a remedy acts on: warn or fail (unknown means "could not probe": never acted on)."""
    return [f for f in _flat(findings) if f.status in (Status.WARN, Status.FAIL)]


def _flat(res) -> list[Finding]:
    if res is None:
        return []
    return [res] if isinstance(res, Finding) else list(res)


def run_check(fn, facts: dict) -> list[Finding]:
    """A registered check's findings over `facts`, as `gpudoctor check` gets them (with their declared remedy)."""
    from gpudoctor.checkreg import findings_of, spec_of

    return findings_of(spec_of(fn), facts)


def target_name(facts: dict) -> str:
    """The name of the host the facts came from: the engine's key for the Host the change applies to."""
    return (facts.get("meta") or {}).get("host") or "localhost"


def tools(facts: dict) -> dict:
    return facts.get("tools") or {}


def command(facts: dict, name: str) -> str | None:
    return (tools(facts).get("commands") or {}).get(name)


def container_kind(facts: dict) -> str | None:
    """lxc | docker | vm | bare, as the host layer detected it (None when not gathered)."""
    return (((facts.get("host") or {}).get("container")) or {}).get("kind")


def in_container(facts: dict) -> bool:
    """A guest whose kernel settings and devices belong to a host it cannot change: an LXC container or any user
    namespace. (A privileged Docker-style container — or a VM whose init says "docker", as the H200 capture shows —
    owns what it can write; the remedies then test the specific capability: /proc/sys writable, systemd running.)"""
    return container_kind(facts) == "lxc" or bool((tools(facts).get("caps") or {}).get("userns"))


def verdict(findings: list[Finding], fid: str, ok_summary: str, bad_summary: str) -> Finding:
    """One Finding summing up re-run check findings: ok when all are ok/info, else the worst with their evidence."""
    if not findings:
        return Finding(fid, Status.UNKNOWN, "the check did not report on the changed subjects after the change")
    st = worst(f.status for f in findings)
    if st == Status.OK:
        return Finding(fid, Status.OK, ok_summary, evidence=[e for f in findings for e in f.evidence[:1]])
    badf = [f for f in findings if f.bad]
    return Finding(fid, st, bad_summary + ": " + "; ".join(f.summary for f in badf),
                   evidence=[e for f in badf for e in f.evidence])


def temp_beside(path: str, tag: str = "gpudoctor") -> str:
    """A hidden temp name in the same directory (same filesystem: rename() is atomic)."""
    d, name = os.path.split(path)
    return os.path.join(d or ".", f".{name}.{tag}.{os.getpid()}.{secrets.token_hex(4)}")


def remove_stale_temps(host, path: str, timeout: float, tag: str = "gpudoctor") -> list[str]:
    """Remove temp_beside() names a killed run left beside path (ours by name; the host lock keeps runs apart)."""
    import re

    d, name = os.path.split(path)
    mine = re.compile(re.escape(f".{name}.{tag}.") + r"\d+\.[0-9a-f]{8}$")
    entries = host.listdir(d or ".", timeout=timeout)
    gone = []
    for e in entries if isinstance(entries, list) else []:
        if mine.match(e):
            try:
                host.unlink(os.path.join(d, e), timeout)
                gone.append(e)
            except OSError:
                pass
    return gone


def errtext(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        import errno

        return f"{errno.errorcode.get(exc.errno or 0, exc.errno)} {exc.strerror or ''}".strip()
    one = getattr(exc, "one_line", None)
    return one() if callable(one) else f"{type(exc).__name__}: {exc}"
