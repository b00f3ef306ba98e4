"""`gpudoctor daemon` in the foreground says what it watches and where /metrics listens, in one line on stderr, and
Ctrl-C (SIGINT) stops it, exit 130 as every command (SIGTERM is the clean stop, exit 0; docs/cli.md; #41, #49)."""

from __future__ import annotations

import re
import signal

from test_daemon_process import OK, scenario


def test_one_line_names_the_metrics_address_and_ctrl_c_stops_it(daemon_factory):
    d = daemon_factory(scenario([OK])).start()
    lines = [ln for ln in d.stderr().splitlines() if ln.startswith("gpudoctor daemon:")]
    assert len(lines) == 1, d.stderr()
    m = re.search(r"/metrics on http://127\.0\.0\.1:(\d+)/metrics", lines[0])
    assert m and f"state {d.state}" in lines[0] and "watching the inventory's hosts every 60 s" in lines[0], lines[0]
    assert d.read_state()["metrics_addr"] == f"127.0.0.1:{m.group(1)}" and d.get("/metrics")[0] == 200
    d.signal(signal.SIGINT)
    assert d.proc.wait(15) == 130
