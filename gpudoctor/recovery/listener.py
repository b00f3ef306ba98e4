"""Whose server answers the verification's serving smoke: `release` marks a host ready on those answers, so they must
come from the expected server, not from whatever a local user left listening on the serving port.

    trusted_listeners(target, url) -> (pids, None) | (None, why)

The listeners come from the target's own process scan (gather/procs.py: the sockets listening on the URL's port, and
the processes holding them). Every one must be expected:
  - run by root (uid 0; gpudoctor's bench starts its servers as root, with its marker), or
  - run by the inventory entry's `serving: {user: NAME|UID}` (the server's owner named by root's inventory), or
  - a system service: its cgroup is a unit under /system.slice/ (systemd put it there; only root defines system
    units), e.g. an SGLang unit with User=sglang.
Anything else is refused with one line naming the listener's pid, uid and command: another user's process, a
process in a user's own systemd instance (user@UID.service), a socket no readable process holds (another network or
PID namespace: it cannot be told whose it is), a port nothing on the target listens on (the URL names another
machine: it cannot be verified from here), or a scan that failed. The smoke checks again after its requests, so a
listener replaced meanwhile fails too.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from gpudoctor.gather.context import GatherContext
from gpudoctor.gather.procs import gather as scan

_SYSTEM_UNIT = re.compile(r"^/system\.slice/(?:[^/]+\.slice/)*([^/]+\.service)(?:/|$)")


def port_of(url: str) -> int | None:
    u = urlsplit(url)
    try:
        return u.port or (443 if u.scheme == "https" else 80)
    except ValueError:
        return None


def system_unit(cgroup: str | None) -> str | None:
    """The system service a cgroup path is in ("sglang.service"), None for anything else (a user's, a scope)."""
    m = _SYSTEM_UNIT.match(cgroup or "")
    return m.group(1) if m else None


def _who(d: dict) -> str:
    uid, user = d.get("uid"), d.get("user")
    cmd = " ".join(str(d.get("cmdline") or d.get("comm") or "?").split())[:80]
    return f"pid {d.get('pid')} (uid {uid}{f' {user}' if user else ''}, {cmd})"


def trusted_listeners(target, url: str, timeout: float = 5.0, owner: str | None = None
                      ) -> tuple[tuple | None, str | None]:
    """((pid, start), ...) of the expected server(s) listening on `url`'s port on the target, or (None, why not).
    `owner`: a user name or uid the inventory names as the server's (serving.user)."""
    port = port_of(url)
    if port is None:
        return None, f"serving.url {url} has no port to look up"
    facts = scan(target.host, GatherContext(name=target.name, sglang_url=url, timeout=timeout))
    if not isinstance(facts, dict) or facts.get("error"):
        why = (facts or {}).get("error") if isinstance(facts, dict) else "no process scan"
        return None, f"whose server listens on port {port} could not be read ({why}): release does not trust it"
    found = (facts.get("listeners") or {}).get(str(port)) or []
    if not found:
        return None, (f"nothing on {target.name} listens on port {port} of {url}: whose server answers cannot be "
                      "verified, so release does not trust its answers")
    pids = []
    for d in found:
        if d.get("pid") is None:
            return None, (f"the listener on port {port} ({d.get('socket')}) is held by no process gpudoctor can "
                          "read (another namespace?): whose server it is cannot be verified, so release does not "
                          "trust its answers")
        mine = owner is not None and owner in (str(d.get("uid")), d.get("user"))
        if d.get("uid") != 0 and not mine and system_unit(d.get("cgroup")) is None:
            named = f", not serving.user {owner}'s" if owner else ""
            return None, (f"the listener on port {port} is {_who(d)}: not root's{named} and not a system "
                          "service's, so release does not trust its answers")
        pids.append((d["pid"], d.get("start")))
    return tuple(sorted(set(pids))), None
