"""Host-side facts about the OCI containers running here: for each, the device nodes and device-cgroup rules its
engine wrote into the runtime's config.json (containerd's task bundles: Docker, Kubernetes; podman's and CRI-O's
userdata), and the rules its cgroup holds now (cgroup v1 devices.list; a cgroup2 device program is opaque here).

Only those fields leave the target: a program on it reads each config.json and prints them, so a container's
environment (tokens, keys) never reaches the facts or a snapshot's transcript.

facts["oci"] = {"containers": [{"id", "name", "engine", "config", "devices": [{path,type,major,minor}],
                                "rules": [{allow,type,major,minor,access}], "cgroup", "live_rules": [...] | None,
                                "live_error": str | None}], "error": str | None}
"""

from __future__ import annotations

import json
import re

from gpudoctor.gather.context import GatherContext
from gpudoctor.host import Host
from gpudoctor.host.childpy import python_argv

# (engine, directory, shape): containerd = DIR/<namespace>/<id>/config.json, userdata = DIR/<id>/userdata/config.json
STATE_DIRS = (
    ("containerd", "/run/containerd/io.containerd.runtime.v2.task", "containerd"),
    ("podman", "/var/lib/containers/storage/overlay-containers", "userdata"),
    ("podman", "/var/lib/containers/storage/vfs-containers", "userdata"),
    ("cri-o", "/run/containers/storage/overlay-containers", "userdata"),
)
MAX_CONTAINERS = 128

_PROBE = r"""
import json, os, sys
dirs = json.loads(sys.argv[1]); limit = int(sys.argv[2])
V1 = "/sys/fs/cgroup/devices"
out, seen = [], set()

def configs():
    for engine, base, shape in dirs:
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        if shape == "containerd":
            for ns in names:
                try:
                    ids = sorted(os.listdir(os.path.join(base, ns)))
                except OSError:
                    continue
                for i in ids:
                    yield ("docker" if ns == "moby" else "kubernetes" if ns == "k8s.io" else engine), \
                        os.path.join(base, ns, i, "config.json"), i
        else:
            for i in names:
                yield engine, os.path.join(base, i, "userdata", "config.json"), i

def cgroup_dir(p):
    if not p:
        return None
    if ":" in p and not p.startswith("/"):  # systemd driver: slice:prefix:name
        sl, prefix, name = (p.split(":") + ["", ""])[:3]
        return "/" + sl + "/" + prefix + "-" + name + ".scope"
    return p

for engine, path, cid in configs():
    if len(out) >= limit or path in seen:
        break
    seen.add(path)
    try:
        with open(path, "rb") as fh:
            cfg = json.loads(fh.read(4 << 20))
    except (OSError, ValueError):
        continue
    lin = cfg.get("linux") or {}
    ann = cfg.get("annotations") or {}
    devs = [{k: d.get(k) for k in ("path", "type", "major", "minor")} for d in lin.get("devices") or []]
    rules = [{k: r.get(k) for k in ("allow", "type", "major", "minor", "access")}
             for r in (lin.get("resources") or {}).get("devices") or []]
    name = ann.get("io.kubernetes.container.name") or ann.get("nerdctl/name") or cfg.get("hostname")
    pod = ann.get("io.kubernetes.pod.name") or ann.get("io.kubernetes.cri.sandbox-name")
    cg = cgroup_dir(lin.get("cgroupsPath"))
    rec = {"id": cid, "name": name, "pod": pod, "engine": engine, "config": path, "devices": devs, "rules": rules,
           "cgroup": cg, "live_rules": None, "live_error": None, "running": None}
    if cg:
        v1 = V1 + cg
        if os.path.isdir(V1):
            try:
                with open(os.path.join(v1, "devices.list")) as fh:
                    rec["live_rules"] = fh.read().split("\n")
                rec["running"] = True
            except OSError as e:
                rec["live_error"] = os.strerror(e.errno)
                rec["running"] = False if e.errno == 2 else None
        else:
            rec["running"] = os.path.isdir("/sys/fs/cgroup" + cg)
            rec["live_error"] = "cgroup2: the device rules are an eBPF program"
    if engine == "docker":
        try:
            with open("/var/lib/docker/containers/%s/config.v2.json" % cid, "rb") as fh:
                rec["name"] = (json.loads(fh.read(4 << 20)).get("Name") or "").lstrip("/") or rec["name"]
        except (OSError, ValueError):
            pass
    out.append(rec)
print(json.dumps({"containers": out}))
"""


def _candidates(shape: str, listing) -> list:
    """Entries that can hold a container: containerd's namespaces, or podman/CRI-O's 64-hex container ids (their
    storage directory also holds containers.json and a lock file)."""
    if not isinstance(listing, list):
        return []
    return listing if shape == "containerd" else [n for n in listing if re.fullmatch(r"[0-9a-f]{64}", n)]


def state_dirs(ctx: GatherContext) -> list:
    return [list(d) for d in (getattr(ctx, "oci_state_dirs", None) or STATE_DIRS)]


def gather(host: Host, ctx: GatherContext) -> dict:
    dirs = state_dirs(ctx)
    t = min(ctx.timeout, 3.0)
    listings = host.batch([("listdir", d[1]) for d in dirs], t)
    if not any(_candidates(d[2], x) for d, x in zip(dirs, listings)):
        return {"containers": [], "error": None}  # no container here: no probe to start
    res = host.run(python_argv(host.python, "-c", _PROBE, json.dumps(dirs), str(MAX_CONTAINERS), site=False),
                   timeout=ctx.timeout)
    if not res.ok:
        return {"containers": [], "error": f"OCI state probe {res.describe()}"}
    try:
        return {**json.loads(res.stdout), "error": None}
    except ValueError:
        return {"containers": [], "error": "OCI state probe printed no JSON"}
