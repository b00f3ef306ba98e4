"""The ladder's series on the daemon's /metrics meet the real promtool: gpudoctor_ready, the one-hot state, its
transition time and the time-between-failures histogram (with observations in several buckets)."""

from __future__ import annotations

import subprocess

from prometheus_client.parser import text_string_to_metric_families

from gpudoctor.daemon.metrics import DaemonMetrics
from gpudoctor.recovery import ladder as L
from gpudoctor.recovery.ladder import HostLadder
from tests import needs


def _promtool(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([needs.need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=30)


def test_ladder_series_are_promtool_valid_and_read_the_ladder():
    m = DaemonMetrics()
    ready = HostLadder(state=L.READY, since=100.0, reason="", verified_at=90.0, verified_boot="b1", boot_id="b1")
    m.observe_ladder("a", ready, "b1")
    m.observe_ladder("b", ready, "b2")  # verified on another boot: not ready, whatever the record says
    m.observe_ladder("c", HostLadder(state=L.INSPECT, since=50.0, reason="needs inspection: x"), None)
    for v in (30, 700, 90000):
        m.between_failures.labels("c").observe(v)
    text = m.render().decode()
    r = _promtool(text)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("gpudoctor_ready", (("host", "a"),))] == 1
    assert samples[("gpudoctor_ready", (("host", "b"),))] == 0
    assert samples[("gpudoctor_ready", (("host", "c"),))] == 0
    assert samples[("gpudoctor_recovery_state", (("host", "b"), ("state", "verifying")))] == 1
    assert samples[("gpudoctor_recovery_state", (("host", "b"), ("state", "ready")))] == 0
    assert samples[("gpudoctor_recovery_state", (("host", "c"), ("state", "needs-inspection")))] == 1
    assert sum(v for (n, lab), v in samples.items() if n == "gpudoctor_recovery_state" and ("host", "c") in lab) == 1
    assert samples[("gpudoctor_recovery_transition_timestamp_seconds", (("host", "c"),))] == 50
    assert samples[("gpudoctor_time_between_failures_seconds_bucket", (("host", "c"), ("le", "60.0")))] == 1
    assert samples[("gpudoctor_time_between_failures_seconds_bucket", (("host", "c"), ("le", "900.0")))] == 2
    assert samples[("gpudoctor_time_between_failures_seconds_count", (("host", "c"),))] == 3
    assert samples[("gpudoctor_time_between_failures_seconds_count", (("host", "a"),))] == 0
