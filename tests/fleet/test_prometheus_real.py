"""gpudoctor's expositions meet the real Prometheus 2.42 tools (Debian): `promtool check metrics` on every one gpudoctor
writes (the daemon's /metrics, `check --prom` of one host, the fleet's textfile), a real Prometheus on 127.0.0.1
scraping the real daemon and node_exporter's textfile collector, and docs/daemon.md listing exactly the series that
appear. The double-series case (one host watched by the daemon and a `--prom` textfile) has the documented answer:
one series per source, and the documented alerts aggregate by host so they fire once."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.procs import stop
from fleet_helpers import replay_check
from prometheus_client.parser import text_string_to_metric_families

from tests import needs

ROOT = Path(__file__).resolve().parents[2]
SNAPS = ROOT / "tests" / "fixtures" / "snapshots"
GPUDOCTOR = Path(sys.executable).with_name("gpudoctor")  # the installed console script


def _env(tmp: Path, **extra) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("GPUDOCTOR_INVENTORY", "PYTHONPATH", "NOTIFY_SOCKET")}
    return {**e, "HOME": str(tmp), **extra}


def _port() -> int:
    """A free loopback port from the kernel, for a tool that takes only HOST:PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _stop(proc: subprocess.Popen) -> None:
    stop(proc, 15)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """The real `gpudoctor daemon` watching this machine (report only, no XID watcher), /metrics on a kernel port."""
    tmp = tmp_path_factory.mktemp("promd")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp / "notify"))
    sock.settimeout(90)
    proc = subprocess.Popen([str(GPUDOCTOR), "daemon", "--observe", "--no-xid", "--state", str(tmp / "state.json"),
                             "--metrics-addr", "127.0.0.1:0", "--interval", "600"], cwd=tmp,
                            env=_env(tmp, NOTIFY_SOCKET=str(tmp / "notify")), stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "daemon.stderr", "wb"))
    try:
        while not sock.recv(4096).startswith(b"READY=1"):
            pass
        addr = json.loads((tmp / "state.json").read_text())["metrics_addr"]
        yield addr
    finally:
        _stop(proc)
        sock.close()


@pytest.fixture(scope="module")
def host_textfile(tmp_path_factory) -> str:
    """`gpudoctor check --prom` of this machine: the textfile a timer would leave for node_exporter."""
    return _textfile(tmp_path_factory.mktemp("promfile")).read_text()


def _textfile(tmp: Path, *args) -> Path:
    prom = tmp / "gpudoctor.prom"
    r = subprocess.run([str(GPUDOCTOR), "check", *args, "--prom", str(prom)], cwd=tmp, env=_env(tmp),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1, 2, 3) and "Traceback" not in r.stderr, r.stderr
    return prom


def _fleet_text() -> str:
    from gpudoctor.errors import HostUnreachable
    from gpudoctor.fleet import check_fleet
    from gpudoctor.integrations.promfile import render

    def check(name):
        if name == "ct9":
            raise HostUnreachable("timed out")
        return replay_check(name)

    res = check_fleet(None, ["h200-uvm-blocked", "h200-healthy", "ct9"], parallel=3, check_fn=check,
                      clock=lambda: 1700000000.0)
    return render(res.prom_records())


def _promtool(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([needs.need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=30)


def test_promtool_accepts_every_exposition(daemon, host_textfile, tmp_path):
    texts = {"daemon /metrics": _get(f"http://{daemon}/metrics"),
             "check --prom (this host)": host_textfile,
             "check --prom (a snapshot)": _textfile(tmp_path, "--snapshot", str(SNAPS / "h200-uvm-blocked.json"))
             .read_text(),
             "fleet textfile": _fleet_text()}
    for what, text in texts.items():
        assert "gpudoctor_host_status" in text, what
        r = _promtool(text)
        assert (r.returncode, r.stdout + r.stderr) == (0, ""), what
    broken = _promtool("gpudoctor_host_status{host=\"a\"} 1\ngpudoctor_host_status{host=\"a\"} 2\n")
    assert broken.returncode != 0  # promtool does judge: a duplicate series fails


def _series(text: str) -> set[str]:
    """The sample names an exposition yields, also of families with no sample yet (a labelled counter before its
    first increment): a counter yields NAME_total, an info NAME_info, a gauge NAME."""
    out = set()
    for fam in text_string_to_metric_families(text):
        out |= {s.name for s in fam.samples}
        out.add({"counter": f"{fam.name}_total", "info": f"{fam.name}_info"}.get(fam.type, fam.name))
    return out


def _documented() -> set[str]:
    doc = (ROOT / "docs" / "daemon.md").read_text()
    table = doc.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in table.splitlines():
        if line.startswith("| `gpudoctor_"):
            names |= set(re.findall(r"`(gpudoctor_\w+)`", line.split("|")[1]))
    return names


# The deep tier's figures exist only where `check --deep --prom` measured them; the daemon never runs the deep tier.
DEEP_ONLY = {"gpudoctor_gpu_bandwidth_ratio", "gpudoctor_gpu_bandwidth_floor"}


def test_docs_list_exactly_the_series_that_appear(daemon, host_textfile, tmp_path):
    daemon_text = _get(f"http://{daemon}/metrics")
    deep = _textfile(tmp_path, "--snapshot", str(ROOT / "examples" / "h200-deep-healthy.json")).read_text()
    files = host_textfile + _fleet_text() + deep
    assert "_created" not in daemon_text + files
    assert "gpudoctor_gpu_bandwidth_ratio{" in deep and "gpudoctor_gpu_bandwidth_floor{" in deep  # measured, not just declared
    documented = _documented()
    appear = _series(daemon_text) | _series(files)
    assert appear == documented, (f"in the exposition, not in docs/daemon.md: {sorted(appear - documented)}; "
                                  f"documented, never exported: {sorted(documented - appear)}")
    # the textfile's names are a subset of the daemon's, same meaning — but for the deep tier's, which only
    # `check --deep` measures
    assert _series(files) - DEEP_ONLY <= _series(daemon_text)


@pytest.fixture
def prometheus(tmp_path, daemon):
    """node_exporter (textfile collector only) and Prometheus (1 s scrapes of it and of the daemon) on 127.0.0.1."""
    exporter, prom = needs.need("node_exporter"), needs.need("prometheus")
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    ne_port, prom_port = _port(), _port()
    procs = []
    try:
        procs.append(subprocess.Popen([exporter, f"--web.listen-address=127.0.0.1:{ne_port}",
                                       "--collector.disable-defaults", "--collector.textfile",
                                       f"--collector.textfile.directory={textdir}"],
                                      stdout=subprocess.DEVNULL, stderr=open(tmp_path / "ne.log", "wb")))
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: gpudoctor-daemon\n    static_configs: [{{targets: ['{daemon}']}}]\n"
            f"  - job_name: node\n    static_configs: [{{targets: ['127.0.0.1:{ne_port}']}}]\n")
        procs.append(subprocess.Popen([prom, f"--config.file={tmp_path / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{prom_port}"],
                                      cwd=tmp_path, stdout=subprocess.DEVNULL,
                                      stderr=open(tmp_path / "prometheus.log", "wb")))
        yield textdir, f"http://127.0.0.1:{prom_port}", tmp_path
    finally:
        for p in reversed(procs):
            _stop(p)
        assert all(p.poll() is not None for p in procs)


def _query(base: str, expr: str) -> list[dict]:
    doc = json.loads(_get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def _two(base: str, expr: str, timeout: float = 30) -> list[dict]:
    """The query's result once it has two series (Prometheus starting, the first scrapes a second apart)."""
    end, got = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            got = _query(base, expr)
            if len(got) == 2:
                return got
        except OSError:  # not listening yet
            pass
        time.sleep(0.3)
    raise AssertionError(f"{expr}: never two series; last {got}")


def test_prometheus_scrapes_the_daemon_and_the_textfile(prometheus, host_textfile):
    textdir, base, tmp = prometheus
    # the same host (this machine) watched twice: by the daemon and by `check --prom` for node_exporter
    (textdir / "gpudoctor.prom").write_text(host_textfile)
    up = _two(base, "up == 1")
    assert {r["metric"]["job"] for r in up} == {"gpudoctor-daemon", "node"}
    raw = _two(base, "gpudoctor_host_status")
    assert {r["metric"]["job"] for r in raw} == {"gpudoctor-daemon", "node"}  # one series per source …
    assert len({r["metric"]["host"] for r in raw}) == 1
    once = _query(base, "max by (host) (gpudoctor_host_status)")  # … and the documented alerts aggregate by host
    assert len(once) == 1 and once[0]["metric"] == {"host": raw[0]["metric"]["host"]}
    checks = _query(base, 'gpudoctor_check_status{job="gpudoctor-daemon"}')
    assert any(r["metric"]["check"] == "host.driver.loaded" for r in checks)
