"""Workload layer: /dev/shm is a tmpfs with room, and SGLang answers when a URL is configured."""

from gpudoctor.checkreg import check
from gpudoctor.findings import Finding, Status


def _gib(n):
    return f"{n / 2**30:.1f} GiB"


@check("workload.shm.tmpfs", summary="/dev/shm is mounted as tmpfs; its size and free space.")
def shm(facts):
    """Models staged in /dev/shm live in RAM: they vanish at reboot and count against the memory cgroup."""
    w = facts.get("workload")
    if not w or "shm" not in w:
        return None
    m, sv = w["shm"].get("mount"), w["shm"].get("statvfs") or {}
    if w.get("mounts_error"):
        return Finding("workload.shm.tmpfs", Status.UNKNOWN, "Could not read /proc/mounts",
                       evidence=[f"/proc/mounts → {w['mounts_error']}"])
    if not m or m["target"] != "/dev/shm":
        return Finding("workload.shm.tmpfs", Status.WARN, "/dev/shm is not a separate mount",
                       evidence=[f"/dev/shm is on {m['target'] if m else '?'} ({m['fstype'] if m else '?'})"])
    ev = [f"/proc/mounts: {m['source']} /dev/shm {m['fstype']} {m['options']}"]
    if "total" in sv:
        ev.append(f"statvfs(/dev/shm): {_gib(sv['total'])} total, {_gib(sv['avail'])} free")
    if m["fstype"] != "tmpfs":
        return Finding("workload.shm.tmpfs", Status.WARN, f"/dev/shm is {m['fstype']}, not tmpfs", evidence=ev)
    size = f"{_gib(sv['total'])}, {_gib(sv['avail'])} free" if "total" in sv else "size unknown"
    return Finding("workload.shm.tmpfs", Status.OK, f"/dev/shm is tmpfs ({size})", evidence=ev,
                   data={k: sv.get(k) for k in ("total", "avail")})


@check("workload.sglang.ready", summary="The SGLang server answers /health and names its model.",
       depends_on=("cuda.init", "devices.*", "workload.model.*"))
def sglang_ready(facts):
    """Only when a server URL is configured (--sglang-url or the inventory)."""
    s = (facts.get("workload") or {}).get("sglang")
    if not s:
        return None
    h = s.get("/health") or {}
    ev = [f"GET {s['url']}/health → {h.get('status') or h.get('error') or s.get('error')}"]
    if h.get("status") == 200:
        mi = s.get("/model_info") or {}
        ev.append(f"GET {s['url']}/model_info → {mi.get('status')}: {(mi.get('body') or '')[:160]}")
        return Finding("workload.sglang.ready", Status.OK, "SGLang is up", evidence=ev)
    if h.get("status") == 503:
        return Finding("workload.sglang.ready", Status.WARN, "SGLang is starting (503)", evidence=ev)
    return Finding("workload.sglang.ready", Status.FAIL, "SGLang does not answer", evidence=ev)
