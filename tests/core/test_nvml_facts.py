"""NVML read in process stands in for `nvidia-smi -q -x` on a check's critical path (#33). What real NVML answered on
the H200 beside nvidia-smi's XML of the same moment (tests/fixtures/captures/h200-2026-12-03/nvml-dump.json) gives
the same driver facts on every field the dump captured; the NVML answer records into a snapshot and replays; a
snapshot holding nvidia-smi's XML still replays; NVML that does not answer falls back to nvidia-smi; a wedged NVML
(a real shared library whose nvmlInit never returns, loaded by the real pynvml) costs the check its deadline, never
a hang."""

import json
import subprocess
import sys
import time

from gpudoctor.gather.driver import compare
from gpudoctor.gather.nvml import FIELDS, facts_from_nvml, usable
from gpudoctor.gather.driver import parse_nvidia_smi_xml
from tests.console import gpudoctor
from tests.needs import need

from .conftest import CAPTURES

H200 = CAPTURES / "h200-2026-12-03"
DUMP = json.loads((H200 / "nvml-dump.json").read_text())
# The dump was written before the reader existed: it never asked these calls (tools/h200_check_latency.sh does).
NOT_IN_DUMP = {"gpus[0].ecc_volatile_uncorrectable", "gpus[0].memory_total_mib", "gpus[0].memory_used_mib",
               "gpus[0].recovery_action"}


def test_nvml_facts_equal_nvidia_smis_on_every_field_the_h200_captured():
    rows = compare(DUMP, DUMP["nvidia_smi_qx"])
    assert len(rows) == len(FIELDS)
    captured = [r for r in rows if r["captured"]]
    assert {r["field"] for r in rows if not r["captured"]} == NOT_IN_DUMP
    assert [r["field"] for r in captured if not r["equal"]] == []
    assert len(captured) == len(FIELDS) - len(NOT_IN_DUMP) == 19
    by = {r["field"]: r["nvml"] for r in captured}
    assert by["driver_version"] == "580.159.04" and by["cuda_version"] == "13.0"
    assert by["gpus[0].bus_id"] == "00000000:00:06.0" and by["gpus[0].pcie.width_max"] == 16
    assert by["gpus[0].clock_event_reasons"]["gpu_idle"] is True


def test_every_driver_fact_nvidia_smi_gives_has_an_nvml_source():
    """No field of nvidia-smi's facts is left without an NVML call: nothing silently missing on the fast path."""
    smi = parse_nvidia_smi_xml(DUMP["nvidia_smi_qx"])
    paths = {k for k in smi if k != "gpus"} | {f"gpus[].{k}" for k in smi["gpus"][0] if k not in ("pcie",
                                                                                              "remapped_rows")}
    paths |= {f"gpus[].pcie.{k}" for k in smi["gpus"][0]["pcie"]}
    paths |= {f"gpus[].remapped_rows.{k}" for k in smi["gpus"][0]["remapped_rows"]}
    assert paths == set(FIELDS)


def test_an_nvml_answer_that_cannot_stand_for_nvidia_smi_says_why():
    assert usable(DUMP) is None
    assert usable({"schema": "gpudoctor.nvml/1", "error": "NVMLError_DriverNotLoaded", "message": "Driver Not Loaded"}
                  ) == "NVML: NVMLError_DriverNotLoaded (Driver Not Loaded)"
    assert usable({"timed_out": True, "timeout_s": 2.0}) == "NVML did not answer in 2.0 s"
    lost = {"schema": "gpudoctor.nvml/1", "system": {"nvmlSystemGetDriverVersion": {"value": "580.159.04"}},
            "devices": [{"nvmlDeviceGetHandleByIndex": {"error": "NVMLError_GpuIsLost"}}]}
    assert usable(lost) == "NVML GPU 0: NVMLError_GpuIsLost"
    # a hostile snapshot: wrong types are no answer, never a traceback
    bad = {"schema": "gpudoctor.nvml/1", "system": {"nvmlSystemGetDriverVersion": {"value": "1"}},
           "devices": [{"nvmlDeviceGetPciInfo_v3": {"value": {"busId": 7}}, "nvmlDeviceGetRemappedRows": {"value": 3},
                        "nvmlDeviceGetComputeRunningProcesses": {"value": [{"pid": [1]}, 5]}}]}
    g = facts_from_nvml(bad)["gpus"][0]
    assert g["bus_id"] is None and g["remapped_rows"]["pending"] is None and g["processes"] == []


def _nvml_snapshot(tmp_path):
    """The H200's healthy deep snapshot as today's recorder writes a live check: NVML in process, no nvidia-smi XML."""
    doc = json.loads((H200 / "h200-deep-healthy.snapshot.json").read_text())
    tr = doc["transcript"]
    del tr['["run",["nvidia-smi","-q","-x"]]']
    tr['["nvml","in-process"]'] = {"schema": "gpudoctor.nvml/1", **{k: v for k, v in DUMP.items()
                                                                     if k in ("system", "devices", "init_ms")}}
    doc["context"]["policy"] = {}
    path = tmp_path / "nvml.snapshot.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_snapshot_of_nvml_read_in_process_replays(tmp_path):
    from gpudoctor import snapshot
    from gpudoctor.target import snapshot_facts

    path = _nvml_snapshot(tmp_path)
    facts = snapshot_facts(snapshot.load(str(path)))
    r = gpudoctor("check", "--snapshot", path, "--json", env={"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": ""})
    assert facts["driver"]["source"] == "nvml"
    assert facts["driver"]["command"] == "NVML in process (NVML 13.580.159.04)"
    assert facts["driver"]["gpus"][0]["name"] == "NVIDIA H200"
    doc = json.loads(r.stdout)
    assert r.returncode == 0, doc["root_cause"]
    init = next(f for f in doc["findings"] if f["id"] == "driver.nvml.init")
    assert init["summary"] == "NVML ok: driver 580.159.04, CUDA 13.0, 1 GPU"
    count = next(f for f in doc["findings"] if f["id"] == "driver.gpu.count")
    assert count["evidence"] == ["NVML sees 1: NVIDIA H200"]


def test_a_snapshot_with_nvidia_smis_xml_still_replays_through_it():
    from gpudoctor import snapshot
    from gpudoctor.target import snapshot_facts

    facts = snapshot_facts(snapshot.load(str(H200 / "h200-deep-ctypes-default.snapshot.json")))
    assert facts["driver"]["source"] == "nvidia-smi" and facts["driver"]["command"] == "nvidia-smi -q -x"
    assert facts["driver"]["gpus"][0]["bus_id"] == "00000000:00:06.0" and "nvml_fallback" not in facts["driver"]


def test_without_nvml_here_the_driver_facts_come_from_nvidia_smi_and_say_why():
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.gather.driver import gather
    from gpudoctor.host.local import LocalHost

    d = gather(LocalHost(), GatherContext(name="here", timeout=5))
    assert d["source"] == "nvidia-smi"  # this CPU machine: no libnvidia-ml.so.1
    assert d["nvml_fallback"].startswith("NVML: NVMLError_LibraryNotFound")


WEDGED = r"""
#include <unistd.h>
int nvmlInit_v2(void) { for (;;) pause(); return 0; }
int nvmlInit(void) { return nvmlInit_v2(); }
int nvmlInitWithFlags(unsigned int f) { return nvmlInit_v2(); }
"""


def test_a_wedged_nvml_costs_the_check_its_deadline_not_a_hang(tmp_path):
    gcc = need("gcc")
    (tmp_path / "wedged.c").write_text(WEDGED)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(tmp_path / "wedged.c")],
                   check=True, capture_output=True)
    t = time.monotonic()
    r = gpudoctor("check", "--json", "--timeout", "2", cwd=tmp_path, timeout=60,
                  env={"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": "", "LD_LIBRARY_PATH": str(tmp_path)})
    took = time.monotonic() - t
    doc = json.loads(r.stdout)
    init = next(f for f in doc["findings"] if f["id"] == "driver.nvml.init")
    assert init["status"] == "unknown" and init["summary"] == "NVML did not answer in 2 s"
    assert "Traceback" not in r.stderr and took < 8, took


def test_a_live_check_starts_nvml_in_process_at_entry_and_no_nvidia_smi():
    """#33: `nvidia-smi -q -x` spawned at entry beside cuInit was the critical path; now NVML's read starts there."""
    code = (
        "import json, sys\n"
        "import gpudoctor.host.early as e, gpudoctor.host.nvml as n\n"
        "e.start_probes(['check'])\n"
        "smi = [k for k in e.EARLY if k[0] == 'nvidia-smi']\n"
        "ans = n.read_within(10.0)\n"
        "print(json.dumps({'smi': smi, 'nvml': sorted(ans), 'adopted': not n.EARLY,\n"
        "                  'click': 'click' in sys.modules}))\n"
        "e.kill_unadopted()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["smi"] == [] and doc["adopted"] and not doc["click"]
    assert "schema" in doc["nvml"] and ("error" in doc["nvml"] or "devices" in doc["nvml"])


# A libnvidia-ml.so.1 answering as the H200 did (nvml-dump.json and the nvidia-smi XML beside it): there is no GPU
# here, so this stands in for the driver the way tests stand nvidia-smi in. The real pynvml loads it; what it answers
# goes through the real reader, a real snapshot and the real parser.
H200_NVML = r"""
#include <string.h>
typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { unsigned fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn;
                 union { double d; unsigned ui; unsigned long long ull; } value; } fv_t;
static int dev = 1;
static int str(char *b, unsigned n, const char *s) { strncpy(b, s, n); b[n - 1] = 0; return 0; }
int nvmlInitWithFlags(unsigned f) { return 0; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int r) { return r == 3 ? "Not Supported" : "Unknown Error"; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { return str(b, n, "580.159.04"); }
int nvmlSystemGetNVMLVersion(char *b, unsigned n) { return str(b, n, "13.580.159.04"); }
int nvmlSystemGetCudaDriverVersion(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = &dev; return 0; }
int nvmlDeviceGetPciInfo_v3(void *h, pci_t *p) {
  memset(p, 0, sizeof *p); strcpy(p->busIdLegacy, "0000:00:06.0"); p->device = 6; p->pciDeviceId = 0x233510de;
  strcpy(p->busId, "00000000:00:06.0"); return 0; }
int nvmlDeviceGetName(void *h, char *b, unsigned n) { return str(b, n, "NVIDIA H200"); }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) { return str(b, n, "GPU-d060a882-66f2-cfa5-0d7f-a63faa68f799"); }
int nvmlDeviceGetMinorNumber(void *h, unsigned *v) { *v = 0; return 0; }
int nvmlDeviceGetPersistenceMode(void *h, unsigned *v) { *v = 1; return 0; }
int nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *v) { *v = 5; return 0; }
int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *v) { *v = 5; return 0; }
int nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned *v) { *v = 16; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *v) { *v = 16; return 0; }
int nvmlDeviceGetEccMode(void *h, unsigned *c, unsigned *p) { *c = *p = 1; return 0; }
int nvmlDeviceGetRemappedRows(void *h, unsigned *a, unsigned *b, unsigned *c, unsigned *d) {
  *a = *b = *c = *d = 0; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *v) { *v = 1; return 0; }
int nvmlDeviceGetNumaNodeId(void *h, unsigned *v) { return 3; }
int nvmlDeviceGetTotalEccErrors(void *h, int t, int c, unsigned long long *v) { *v = 0; return 0; }
int nvmlDeviceGetMemoryInfo_v2(void *h, mem2_t *m) {
  m->total = 143771ULL << 20; m->reserved = 616ULL << 20; m->used = 0; m->free = m->total - m->reserved; return 0; }
int nvmlDeviceGetFieldValues(void *h, int n, fv_t *v) {
  for (int i = 0; i < n; i++) { v[i].nvmlReturn = 0; v[i].valueType = 1; v[i].value.ull = 0; } return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *n, void *p) { *n = 0; return 0; }
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *h, unsigned *n, void *p) { *n = 0; return 0; }
"""


def test_nvml_read_through_pynvml_records_replays_and_gives_nvidia_smis_facts(tmp_path):
    gcc = need("gcc")
    (tmp_path / "nvml.c").write_text(H200_NVML)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "libnvidia-ml.so.1"), str(tmp_path / "nvml.c")],
                   check=True, capture_output=True)
    env = {"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": "", "LD_LIBRARY_PATH": str(tmp_path)}
    snap = tmp_path / "nvml.snapshot.json"
    r = gpudoctor("snapshot", "-o", snap, cwd=tmp_path, env=env)
    assert snap.is_file(), r.stderr
    doc = json.loads(snap.read_text())
    raw = doc["transcript"]['["nvml","in-process"]']
    assert raw["schema"] == "gpudoctor.nvml/1" and "error" not in raw and raw["init_ms"] >= 0
    assert '["run",["nvidia-smi","-q","-x"]]' not in doc["transcript"]  # NVML answered: nvidia-smi never ran
    driver = doc["facts"]["driver"]
    assert driver["source"] == "nvml" and driver["command"] == "NVML in process (NVML 13.580.159.04)"
    rows = compare(raw, DUMP["nvidia_smi_qx"])
    assert [r["field"] for r in rows if not (r["equal"] and r["captured"])] == []
    assert len(rows) == len(FIELDS)
    replay = gpudoctor("check", "--snapshot", snap, "--json", env={"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": ""})
    by = {f["id"]: f for f in json.loads(replay.stdout)["findings"]}
    assert by["driver.nvml.init"]["summary"] == "NVML ok: driver 580.159.04, CUDA 13.0, 1 GPU"
    assert by["driver.nvml.init"]["evidence"][0].startswith("$ NVML in process (NVML 13.580.159.04) → rc 0 in ")
    assert by["driver.recovery_action"]["evidence"] == ["NVML: gpu_recovery_action = None"]
