"""HostLauncher over a real sshd: detached start, exit status, process-group stop, log mirror, no shell injection.

The "remote" processes run on this machine through sshd, so /proc shows what the target would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.bench.server import remote
from gpudoctor.bench.server.remote import HostLauncher, reap_remote_orphan


def live_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc here."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(stat.parent.name))
    return out


@pytest.fixture
def launch(ssh_host, tmp_path):
    made: list[HostLauncher] = []

    def make(label: str = "srv") -> HostLauncher:
        lau = HostLauncher(ssh_host, str(tmp_path / "remote"), label, str(tmp_path / "logs" / f"{label}.log"),
                           str(tmp_path / "server.pid"))
        made.append(lau)
        return lau

    yield make
    for lau in made:  # never leave a process behind, whatever the test did
        if lau.pid and live_group(lau.pid):
            os.killpg(lau.pid, signal.SIGKILL)


def wait_for(pred, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_stop_takes_the_whole_group_and_escalates_to_kill(launch, tmp_path):
    # A server with a child (SGLang forks schedulers) that ignores SIGTERM: SIGKILL after the timeout takes both.
    lau = launch()
    pid = lau.start(["sh", "-c", "trap '' TERM; sleep 300 & echo started; wait"], {})
    assert wait_for(lambda: len(live_group(pid)) == 3)  # wrapper, sh, sleep
    assert lau.gone() is None
    info = json.loads((tmp_path / "server.pid").read_text())
    assert info["host"] == "sshd-test" and info["pid"] == pid
    assert info["argv"][:4] == ["sh", "-c", remote._WRAPPER, "gpudoctor-bench-server"]
    assert info["argv"][-3:] == ["sh", "-c", "trap '' TERM; sleep 300 & echo started; wait"]
    t0 = time.monotonic()
    lau.stop(timeout=0.5)
    took = time.monotonic() - t0
    assert live_group(pid) == []
    assert 0.5 <= took < 5.0
    assert not (tmp_path / "server.pid").exists()
    assert "started" in (tmp_path / "logs" / "srv.log").read_text()


def test_exit_status_and_signal_are_reported(launch):
    lau = launch()
    lau.start(["sh", "-c", "echo bye; exit 3"], {})
    assert wait_for(lambda: lau.gone() is not None)
    assert lau.gone() == "server process exited with rc 3"
    lau.start([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], {})
    assert wait_for(lambda: lau.gone() is not None)
    assert lau.gone() == "server process killed by signal 9"


def test_server_outlives_its_ssh_connection(launch, ssh_host, sshd):
    lau = launch()
    pid = lau.start(["sleep", "300"], {})
    assert sshd.cut_connections() >= 1  # every sshd session process killed: the client's connection drops
    assert wait_for(lambda: not ssh_host.connected)
    assert live_group(pid) != []  # detached (setsid, nohup, no file of the session held): still running
    assert lau.gone() is None  # asked again over a new connection
    lau.stop(timeout=5)
    assert live_group(pid) == []


def test_hostile_arguments_reach_the_server_literally(launch, tmp_path):
    marker = tmp_path / "injected"
    hostile = [f"$(touch {marker})", f"`touch {marker}`", f"; touch {marker}", "it's", 'a "quoted" word',
               "two\nlines", "*", "~/x", "$HOME"]
    lau = launch("odd'label")
    out = tmp_path / "argv.json"
    lau.start([sys.executable, "-c", "import json, sys; open(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))",
               str(out), *hostile], {"ODD": "$(touch {})".format(marker)})
    assert wait_for(lambda: lau.gone() is not None)
    assert json.loads(out.read_text()) == hostile
    assert not marker.exists()
    assert (tmp_path / "remote" / "odd'label.log").exists()


def test_environment_reaches_the_server(launch, tmp_path):
    lau = launch()
    lau.start(["sh", "-c", 'echo "level=$NCCL_P2P_LEVEL"'], {"NCCL_P2P_LEVEL": "NVL"})
    assert wait_for(lambda: lau.gone() is not None)
    lau.sync_log()
    assert "level=NVL" in (tmp_path / "logs" / "srv.log").read_text()


def test_log_mirror_copies_only_new_bytes_and_says_when_it_skips(launch, tmp_path, monkeypatch):
    lau = launch()
    lau.start(["sleep", "300"], {})
    remote_log = Path(lau.remote_log)
    mirror = tmp_path / "logs" / "srv.log"
    assert mirror.read_bytes() == remote_log.read_bytes()  # start copies the header
    with open(remote_log, "ab") as f:
        f.write(b"line one\n\xff\xfe not utf-8\n")
    lau.sync_log()
    lau.sync_log()  # nothing new: nothing appended
    assert mirror.read_bytes() == remote_log.read_bytes()
    monkeypatch.setattr(remote, "SYNC_CAP", 10)
    with open(remote_log, "ab") as f:
        f.write(b"x" * 100 + b"\nlast words\n")
    lau.sync_log()
    text = mirror.read_text(errors="replace")
    assert text.endswith(f"=== gpudoctor: 102 bytes of {remote_log} not copied (more than 10 since the last copy)\n"
                         "ast words\n")  # the newest bytes are kept
    monkeypatch.setattr(remote, "SYNC_CAP", 8 << 20)
    remote_log.write_bytes(b"replaced\n")
    lau.sync_log()
    assert mirror.read_text(errors="replace").endswith("shrank on sshd-test; copying it from its start\nreplaced\n")
    lau.stop(timeout=5)


def test_reap_stops_a_left_server_but_never_a_stranger(launch, ssh_host, tmp_path):
    lau = launch()
    pid = lau.start(["sleep", "300"], {})
    info = json.loads((tmp_path / "server.pid").read_text())
    stranger = dict(info, argv=["sleep", "301"])  # the pid now runs something else
    assert reap_remote_orphan(ssh_host, stranger, timeout=2) is None
    assert live_group(pid) != []
    assert reap_remote_orphan(ssh_host, info, timeout=2) == \
        f"stopped server left running on sshd-test by an interrupted campaign (pid {pid})"
    assert live_group(pid) == []
    assert reap_remote_orphan(ssh_host, info, timeout=2) is None  # nothing left to stop


def test_a_command_that_is_not_there_is_an_oserror(launch, tmp_path):
    lau = launch()
    with pytest.raises(OSError) as exc:
        lau.start(["/opt/venv-that-is-not-there/bin/python", "-m", "sglang.launch_server"], {})
    assert exc.value.strerror == "not found on sshd-test"
    assert "cannot start /opt/venv-that-is-not-there/bin/python: not found" in \
        (tmp_path / "remote" / "srv.log").read_text()


def test_run_dir_scan_finds_a_server_that_was_never_recorded_here(launch, ssh_host, tmp_path):
    # gpudoctor killed between the remote start and writing server.pid: only the target knows the server.
    from gpudoctor.bench.server.remote import reap_run_dir

    lau = launch()
    pid = lau.start(["sleep", "300"], {})
    (tmp_path / "server.pid").unlink()
    other = launch("done")
    other.start(["true"], {})  # exited: its pid file stays, nothing to stop
    assert wait_for(lambda: other.gone() is not None)
    assert reap_run_dir(ssh_host, str(tmp_path / "remote"), timeout=2) == [
        f"stopped server left running on sshd-test by an interrupted campaign (pid {pid})"]
    assert live_group(pid) == []
    assert reap_run_dir(ssh_host, str(tmp_path / "nowhere"), timeout=2) == []
