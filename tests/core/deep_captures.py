"""Deep snapshots built from the real H200 capture (examples/h200-healthy.json) and the deep figures the H200 gave.

The capture's transcript is kept as recorded; what the deep tier adds is appended as the recording host would have
written it: nvidia-smi's GPU and process lists, the measuring child's JSON line and the NCCL probe's line
(docs/h200/deep-tp1.txt). The healthy figures are the H200's (issue #27: H2D 53.0, D2H 55.3, pageable 6.6 / 16.3
GB/s, device copy 4.23 TB/s, bf16 GEMM 798 TFLOP/s). A faulty scenario changes what the H200 could not show (a
downtrained link, MaxReadReq 128, a remote NUMA node, a power cap, another process, errors) in the capture's
nvidia-smi XML, config space or the child's samples, with figures scaled as that fault limits them.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from gpudoctor.gather.deep import PROBE_BEFORE_33 as NCCL_PROBE  # as the H200 snapshots recorded it
from gpudoctor.gather.deep_gpu import QUERY_APPS, QUERY_GPUS, child_args, settings

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "examples" / "h200-healthy.json"
BUS = "00000000:00:06.0"
GIB = 1 << 30


def _key(argv) -> str:
    return json.dumps(["run", argv], separators=(",", ":"))


def _run(argv, stdout="", rc=0, duration=0.1) -> dict:
    return {"argv": argv, "rc": rc, "stdout": stdout, "stderr": "", "duration_s": duration, "timed_out": False,
            "timeout_s": 45.0}


def samples(*, link=(5, 16), reasons=(), procs=(), power=(118.0, 163.0), sm=(1980, 1980), util=(0, 100)) -> dict:
    return {"n": 9, "sm": list(sm), "mem": [3201, 3201], "power": list(power), "temp": [31, 34], "util": list(util),
            "reasons": sorted(reasons), "link": [{"gen": link[0], "width": link[1]}], "procs": list(procs)}


def _test(kind, value, reps, *, nbytes=GIB, **kw) -> dict:
    if kind == "gemm":
        per = 2 * 8192 ** 3 / (value * 1e12)
    else:
        per = (2 * nbytes if kind == "d2d" else nbytes) / (value * 1e9)
    t = {"kind": kind, "seconds": [round(per * (1 + 0.004 * i), 6) for i in range(reps)], "samples": samples()}
    if kind == "gemm":
        t.update(n=8192, dtype="bf16", tflops=value)
    else:
        t.update(bytes=nbytes, gbs=value)
    if kind == "d2d":
        t["counted"] = "read+write"
    t.update(kw)
    return t


def healthy_child() -> dict:
    """The child's record as the H200's figures give it (one NUMA node: the VM reports none for the GPU)."""
    pages = {"0": 16}
    return {
        "schema": "gpudoctor.deep.gpu/1", "device": 0, "pid": 4711, "backend": "torch", "torch": "2.11.0+cu130",
        "error": None, "name": "NVIDIA H200", "bus_id": BUS, "notes": [], "skipped": [],
        "before": {"ecc_uncorrected": 0, "ecc_corrected": 0,
                   "remap": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}, "mig": 0,
                   "power_limit_w": 700.0, "link_max": {"gen": 5, "width": 16, "gpu_gen": 5},
                   "app_clocks_mhz": {"sm": 1980, "sm_default": 1980}},
        "idle": {"n": 6, "util": [0, 0], "reasons": ["gpu_idle"], "procs": [], "link": [{"gen": 5, "width": 16}]},
        "numa": {"bdf": "0000:00:06.0", "gpu_node": None, "nodes": [0], "gpu_cpus": "0-15", "mems_allowed": "0",
                 "cpus_allowed": "0-15"},
        "tests": [
            _test("h2d", 53.0, 5, memory="pinned", placement="local", node=None, page_nodes=pages, policy_note=None),
            _test("d2h", 55.3, 5, memory="pinned", placement="local", node=None, page_nodes=pages, policy_note=None),
            _test("h2d", 6.6, 3, memory="pageable", placement="local", node=None, page_nodes=pages),
            _test("d2h", 16.3, 3, memory="pageable", placement="local", node=None, page_nodes=pages),
            _test("d2d", 4230.0, 20),
            _test("gemm", 798.0, 20),
        ],
        "uptime_start": 5000.0, "uptime_end": 5009.6, "elapsed_s": 9.6,
    }


def test_of(child: dict, kind: str, memory: str | None = None, placement: str | None = None) -> dict:
    return next(t for t in child["tests"] if t["kind"] == kind and (memory is None or t.get("memory") == memory)
                and (placement is None or t.get("placement") == placement))


def build(child: dict | None = None, *, policy: dict | None = None, apps: str = "", xml_edits=(),
          mrrs: int | None = None, xids=()) -> dict:
    """A deep snapshot: the H200 capture plus the deep tier's answers (`child` None: the GPU is not measured)."""
    doc = copy.deepcopy(json.loads(CAPTURE.read_text()))
    pol = {"deep": True, **(policy or {})}
    doc["context"]["policy"] = pol
    doc["facts"] = {}
    tr = doc["transcript"]
    xml_key = _key(["nvidia-smi", "-q", "-x"])
    for old, new in xml_edits:
        assert old in tr[xml_key]["stdout"], old
        tr[xml_key]["stdout"] = tr[xml_key]["stdout"].replace(old, new)
    if mrrs is not None:  # DevCtl bits 14:12 of the capture's PCI Express capability
        for key, val in tr.items():
            if "/sys/bus/pci/devices" in key and "config_hex" in val.get("stdout", ""):
                data = json.loads(val["stdout"])
                for g in data["gpus"]:
                    cfg = bytearray.fromhex(g["config_hex"])
                    ptr = cfg[0x34] & 0xFC
                    while cfg[ptr] != 0x10:
                        ptr = cfg[ptr + 1] & 0xFC
                    ctl = int.from_bytes(cfg[ptr + 8:ptr + 10], "little")
                    ctl = (ctl & ~0x7000) | ((mrrs.bit_length() - 8) << 12)
                    cfg[ptr + 8:ptr + 10] = ctl.to_bytes(2, "little")
                    g["config_hex"] = cfg.hex()
                val["stdout"] = json.dumps(data)
    tr[_key(QUERY_GPUS)] = _run(QUERY_GPUS, f"0, {BUS}, NVIDIA H200\n")
    tr[_key(QUERY_APPS)] = _run(QUERY_APPS, apps)
    if child is not None:
        # "python3 - ARGS" with the program on stdin; the recording host keys it without the interpreter's flags
        argv = ["<python>", child_args(0, [], settings(pol))]
        tr[_key(argv)] = _run(["python3", "-", argv[1]], json.dumps(child, sort_keys=True) + "\n",
                              duration=child["elapsed_s"] + 1.2)
        rdv = "/tmp/.gpudoctor-nccl-0"
        nccl = ["<python>", "-c", NCCL_PROBE, "0", "1", rdv, "0", str(256 << 20), "20"]
        line = {"seconds_per_op": (256 << 20) / 8639.7e9, "algbw_gbs": 8639.7, "busbw_gbs": 0.0, "nccl": "2.28.9"}
        tr[_key(nccl)] = _run(nccl, json.dumps(line) + "\n", duration=6.9)
        tr[_key(["rm", "-f", rdv])] = _run(["rm", "-f", rdv])
        # the kernel log read after the children, over the window their own uptimes give (gather/deep_gpu.py)
        from gpudoctor.gather.kernel_log import _PY_KMSG, MAX_RECORDS, MAX_XIDS

        window = math.ceil(child["uptime_end"] - child["uptime_start"]) + 2
        kmsg = ["<python>", "-c", _PY_KMSG, str(window), str(MAX_RECORDS), str(MAX_XIDS), "5.0", "/dev/kmsg"]
        tr[_key(kmsg)] = _run(kmsg, json.dumps({"uptime": child["uptime_end"] + 0.5, "scanned": 4096,
                                                "truncated": False, "lines": [list(x) for x in xids]}) + "\n")
    return doc


def write(doc: dict, path: Path) -> Path:
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


# --- two GPUs: the 2-GPU H200 capture (NVLink NV18 between them) ------------------------------------------------
CAPTURE_X2 = ROOT / "tests" / "fixtures" / "snapshots" / "h200x2-healthy.json"
BUS1 = "00000000:00:07.0"


def healthy_child_x2(index: int, p2p_gbs: float | None = None, can_access: bool = True) -> dict:
    """GPU `index` of the 2-GPU host: the H200's single-GPU figures; GPU 0 also copies to GPU 1 (p2p_gbs: no P2P
    figure was measured on that host — the healthy value is an assumption, the faulty ones scale from the link)."""
    c = healthy_child()
    c.update(device=index, bus_id=BUS if index == 0 else BUS1, pid=4711 + index)
    c["numa"].update(bdf="0000:00:06.0" if index == 0 else "0000:00:07.0", gpu_cpus="0-31", cpus_allowed="0-31")
    if p2p_gbs is not None:
        c["tests"].append(_test("p2p", p2p_gbs, 5, nbytes=256 << 20, peer=1, can_access_peer=can_access))
    return c


def build_x2(children: list[dict], *, topo=None, p2p=None) -> dict:
    """A deep snapshot of the 2-GPU capture; `topo`/`p2p` replace the pair's cell in `nvidia-smi topo -m` / `-p2p r`."""
    doc = copy.deepcopy(json.loads(CAPTURE_X2.read_text()))
    pol = {"deep": True}
    doc["context"]["policy"] = pol
    doc["facts"] = {}
    tr = doc["transcript"]
    if topo:
        k = _key(["nvidia-smi", "topo", "-m"])
        tr[k]["stdout"] = tr[k]["stdout"].replace("NV18", topo)
    if p2p:
        k = _key(["nvidia-smi", "topo", "-p2p", "r"])
        tr[k]["stdout"] = tr[k]["stdout"].replace("X\tOK", f"X\t{p2p}").replace("OK\tX", f"{p2p}\tX")
    tr[_key(QUERY_GPUS)] = _run(QUERY_GPUS, f"0, {BUS}, NVIDIA H200\n1, {BUS1}, NVIDIA H200\n")
    tr[_key(QUERY_APPS)] = _run(QUERY_APPS, "")
    for i, child in enumerate(children):
        argv = ["<python>", child_args(i, [j for j in range(len(children)) if j > i], settings(pol))]
        tr[_key(argv)] = _run(["python3", "-", argv[1]], json.dumps(child, sort_keys=True) + "\n",
                              duration=child["elapsed_s"] + 1.2)
    rdv = "/tmp/.gpudoctor-nccl-0_1"
    alg = 296.3 if not topo else 21.0  # docs/h200x2/check-deep.json over NV18; through host memory without it
    for rank in (0, 1):
        nccl = ["<python>", "-c", NCCL_PROBE, str(rank), "2", rdv, str(rank), str(256 << 20), "20"]
        line = {"seconds_per_op": (256 << 20) / (alg * 1e9), "algbw_gbs": alg, "busbw_gbs": alg, "nccl": "2.28.9"}
        tr[_key(nccl)] = _run(nccl, json.dumps(line) + "\n" if rank == 0 else "", duration=7.4)
    tr[_key(["rm", "-f", rdv])] = _run(["rm", "-f", rdv])
    return doc
