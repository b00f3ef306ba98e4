"""Host health per level: the sampler against a fake NVML built from a real H200 capture, the real no-NVML path of
this machine, the kernel log, and the suspect verdicts they lead to."""

from __future__ import annotations

import math
import time

import pytest

from gpudoctor.bench.cell import health, suspect
from gpudoctor.bench.records.stats import mean_ci, t975
from tests.bench.fakenvml import FakeNVML, assert_real_health


def run_sampler(nv, during, *, interval=0.05, duration=0.4, **kw):
    s = health.Sampler(nv, interval_s=interval, kernel_log=kw.pop("kernel_log", None), **kw).start()
    try:
        during(s)
        time.sleep(duration)
    finally:
        out = s.stop()
    return out


def test_h200_capture_sampled_with_nvml_units():
    nv = FakeNVML()
    out = run_sampler(nv, lambda s: None)
    assert out["status"] == "sampled" and out["samples"] >= 5
    g = out["gpus"]["0"]
    assert g["bus_id"] == "00000000:00:06.0"
    assert g["sm_mhz"] == {"min": 1980, "median": 1980, "max": 1980}
    assert g["mem_mhz"]["median"] == 3201
    assert g["power_w"]["median"] == pytest.approx(125.42) and g["power_limit_w"]["max"] == pytest.approx(700.0)
    assert g["temp_c"]["max"] == 34 and g["mem_used_mib"]["max"] == 0 and g["util_pct"]["max"] == 0
    assert g["reasons_seen"] == ["gpu_idle"]  # the capture's idle card
    assert g["deltas"] == {k: 0 for k in health.COUNTERS}
    assert out["events"] == [] and nv.inited == 0  # nvmlShutdown after nvmlInit
    assert suspect.judge(out) is None


def test_no_nvml_here_says_unavailable_with_the_reason():
    out = run_sampler(None, lambda s: None, duration=0.1)  # the real pynvml: no driver library on this machine
    assert_real_health(out)
    if out["status"] == "unavailable":
        assert out["reason"].startswith("NVML unavailable: NVMLError_LibraryNotFound") or "Driver" in out["reason"]
        assert suspect.judge(out) is None


def test_changes_mid_level_become_events_and_suspect_reasons():
    nv = FakeNVML()
    nv.busy()
    nv.add_process(4242, 70000)  # the server, there when the level starts

    def change(s):
        time.sleep(0.15)
        nv.add_reason("hw_thermal_slowdown")
        nv.add_process(777, 2048)
        nv.xid(79)
        nv.set(ecc_corr=nv.gpus[0].ecc_corr + 3)

    out = run_sampler(nv, change)
    kinds = {e["kind"] for e in out["events"]}
    assert kinds == {"clock_event", "foreign_process", "xid"}
    fp = next(e for e in out["events"] if e["kind"] == "foreign_process")
    assert fp["pid"] == 777 and fp["used_mib"] == 2048 and 0.1 <= fp["t"] <= 0.5
    assert out["gpus"]["0"]["deltas"]["ecc_corrected"] == 3
    why = suspect.judge(out)
    by = {w["kind"]: w["reason"] for w in why}
    assert sorted(by) == ["clock_event", "ecc", "foreign_process", "xid"] and len(why) == 4
    assert "pid 777" in by["foreign_process"] and "Xid 79" in by["xid"] and "hw_thermal" in by["clock_event"]


def test_server_pids_given_flag_a_process_there_from_the_start():
    nv = FakeNVML()
    nv.busy()
    nv.add_process(4242, 70000)
    nv.add_process(999, 100)
    out = run_sampler(nv, lambda s: None, server_pids=lambda: {4242}, duration=0.1)
    assert [e["pid"] for e in out["events"] if e["kind"] == "foreign_process"] == [999]


def test_sm_clock_under_the_levels_median_is_suspect_and_the_threshold_is_a_key():
    nv = FakeNVML()
    nv.busy()

    def dip(s):
        time.sleep(0.2)
        nv.set(sm=1500)
        time.sleep(0.1)
        nv.set(sm=1980)

    out = run_sampler(nv, dip)
    why = suspect.judge(out)
    assert why and why[0]["kind"] == "sm_clock" and "1500 MHz" in why[0]["reason"]
    assert suspect.judge(out, {"sm_clock_drop": 0.3}) is None  # 1500 is 76 % of 1980: within a 30 % drop


def test_idle_clock_dips_are_not_suspect():
    nv = FakeNVML()  # idle: gpu_idle set, clocks may fall
    out = run_sampler(nv, lambda s: (time.sleep(0.1), nv.set(sm=345)))
    assert suspect.judge(out) is None


def test_kernel_log_xid_lines_after_start_only(tmp_path):
    klog = tmp_path / "kern.log"
    klog.write_text("NVRM: Xid (PCI:0000:00:06): 48, pid=1, name=old, an old one\n")

    def write(s):
        time.sleep(0.1)
        with klog.open("a") as fh:
            fh.write("kernel: NVRM: Xid (PCI:0000:00:06): 79, pid=4242, name=python3, GPU has fallen off the bus.\n")

    out = run_sampler(None, write, kernel_log=str(klog))
    assert_real_health(out)  # no NVML here, but the kernel log is still read
    (e,) = out["events"]
    assert e["xid"] == 79 and e["source"] == "kernel log" and e["bus_id"] == "0000:00:06"
    assert suspect.judge(out)[0]["kind"] == "xid"
    assert suspect.judge(out, {"xid": False}) is None


def test_dev_kmsg_opens_at_its_end():
    k = health.KernelLog("/dev/kmsg")
    k.open()
    try:
        assert k.reason is None or "Permission" in k.reason or "Operation" in k.reason
        if k.reason is None:
            assert all("Linux version" not in line for line in k.lines())  # the boot banner is before the end
    finally:
        k.close()


def test_sampling_at_2hz_costs_little_cpu():
    out = run_sampler(FakeNVML(copies=8), lambda s: None, interval=0.5, duration=1.2)
    assert out["samples"] >= 3 and out["sampler_cpu_s"] < 0.2  # the cost itself: bench/health_cost.py


def test_suspect_keys_are_checked():
    errs = []

    def fail(msg, *where):
        errs.append(msg)
        raise ValueError(msg)

    assert suspect.check({"sm_clock_drop": 0.2}, fail)["sm_clock_drop"] == 0.2
    for bad in ({"sm_clock_drop": 1.5}, {"xid": "yes"}, {"clock_reasons": ["hot"]}, {"ecc": 1}, {"ecc_errors": -1}):
        with pytest.raises(ValueError):
            suspect.check(bad, fail)
    assert "unknown key 'ecc'" in errs[3]


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x) by Simpson integration of the t density (independent of the table)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    n = 20000
    h = x / n
    f = lambda t: c * (1 + t * t / df) ** (-(df + 1) / 2)  # noqa: E731
    s = f(0) + f(x) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return 0.5 + s * h / 3


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 9, 17, 30, 45, 90, 200])
def test_t_table_is_the_975_quantile(df):
    assert _t_cdf(t975(df), df) == pytest.approx(0.975, abs=2e-5 if df <= 30 else 2e-4)


def test_mean_ci():
    m, h, n = mean_ci([26.0, 26.4, 26.2])
    assert (m, n) == (pytest.approx(26.2), 3)
    assert h == pytest.approx(4.3027 * 0.2 / math.sqrt(3))
    assert mean_ci([1.0]) == (1.0, None, 1) and mean_ci([None]) == (None, None, 0)


def test_remote_sampler_runs_on_the_target_through_the_host_seam(tmp_path):
    """The sampler started detached through Host.run as `python3 -c <health.py>` (the same path as over SSH), its
    kernel log read there, its raw state read back with Host.read_file and summarised here."""
    from gpudoctor.target import local_host

    klog = tmp_path / "kern.log"
    klog.write_text("")
    host = local_host()
    rs = health.RemoteSampler(host, str(tmp_path / "run"), "lvl", interval_s=0.05, kernel_log=str(klog)).start()
    assert rs.pid is not None, rs.error
    try:
        time.sleep(0.5)
        with klog.open("a") as fh:
            fh.write("NVRM: Xid (PCI:0000:00:06): 94, pid=9, name=python3, Contained ECC error.\n")
        time.sleep(0.3)
    finally:
        out = rs.stop()
    assert_real_health(out)  # no driver here either
    (e,) = out["events"]
    assert e["xid"] == 94 and e["source"] == "kernel log" and out["host"] == host.name
    assert suspect.judge(out)[0]["kind"] == "xid"
    try:  # gone after stop (a zombie where init does not reap, as in many containers)
        with open(f"/proc/{rs.pid}/stat") as fh:
            assert fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        pass


def test_remote_sampler_that_cannot_start_says_why(tmp_path):
    from gpudoctor.target import local_host

    host = local_host()
    rs = health.RemoteSampler(host, "/proc/no-such-dir/x", "lvl").start()
    out = rs.stop()
    assert out["status"] == "unavailable" and "did not start" in out["reason"]


def test_an_orphaned_remote_sampler_ends_with_the_servers_session(tmp_path):
    """The campaign was killed mid-level: the sampler on the target must not outlive the server it watches."""
    import subprocess

    from gpudoctor.target import local_host

    server = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        rs = health.RemoteSampler(local_host(), str(tmp_path), "lvl", interval_s=0.1, kernel_log=None,
                                  server_pgid=server.pid).start()
        assert rs.pid is not None, rs.error
        time.sleep(1.0)
    finally:
        server.kill()
        server.wait()
    out = tmp_path / "lvl.health.json"
    end = time.monotonic() + 15
    while not out.exists() and time.monotonic() < end:
        time.sleep(0.1)
    assert out.exists()  # it noticed, wrote its section and ended
    import json

    assert json.loads(out.read_text())["status"] in ("sampled", "unavailable")
    rs.stop()  # reaps the (exited) process; nothing left behind
