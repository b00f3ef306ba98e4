"""The server on an inventory host: started, watched and stopped through the Host seam, its log copied back.

`HostLauncher` implements `server.Launcher` with `Host.run` alone, so it works over SSH (and any other backend):

start     one `sh -c` on the target: make the run directory, append a header to DIR/LABEL.log, then
          `setsid nohup sh -c WRAPPER ... >>LOG 2>&1 </dev/null &`. The wrapper writes its pid (the id of the new
          session and process group) to LABEL.pid, runs the server, and writes the server's exit status to LABEL.rc.
          Detached this way the server outlives the SSH command, the connection and a SIGKILLed gpudoctor.
gone      LABEL.rc exists: the server exited (rc N, or killed by signal N); else the wrapper is missing from /proc
          or a zombie (an init that does not reap is common in containers, so zombies never count as alive).
stop      SIGTERM the process group, poll /proc until no live process of the group is left, SIGKILL after the
          timeout; then copy the rest of the log.
sync_log  copy the bytes the remote log gained since the last copy (an offset read, base64 over the command's
          stdout) and append them to the local mirror DIR/logs/LABEL.log, where the crash excerpts are read.
          Host.read_file reads a file from its start up to a cap, which cannot follow a log that grows for hours.

Every remote path and argument reaches the target as one quoted argument (Host.run quotes; the scripts below use
only "$n" positional parameters), so a hostile model path or label cannot inject shell.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import time
from pathlib import Path

from gpudoctor.errors import HostError
from gpudoctor.host.base import Host
from gpudoctor.host.childpy import python_argv
from gpudoctor.files.atomic import atomic_write
from gpudoctor.host import ops as fs  # the mutation seam (tests/crash)
from gpudoctor.log import get_logger

DEFAULT_REMOTE_DIR = "~/.cache/gpudoctor/bench"
SYNC_CAP = 8 << 20  # bytes copied per sync at most; more than this since the last copy keeps the newest

# Runs in the new session: record our pid (= process group id), run the server, record how it ended.
_WRAPPER = r"""pidf=$1 rcf=$2
shift 2
echo $$ > "$pidf.tmp" && mv -f "$pidf.tmp" "$pidf"
"$@"
rc=$?
echo $rc > "$rcf.tmp" && mv -f "$rcf.tmp" "$rcf"
exit $rc
"""

# $1 wrapper script, $2 run dir, $3 label, then the server argv. Prints dir=, offset=, pid= lines.
_START = r"""w=$1 d=$2 name=$3
shift 3
case $d in "~/"*) d=$HOME/${d#"~/"} ;; esac
mkdir -p "$d" && d=$(cd "$d" && pwd -P) || { echo "cannot create the run directory $2"; exit 90; }
log=$d/$name.log pidf=$d/$name.pid rcf=$d/$name.rc
rm -f "$pidf" "$rcf"
off=0
if [ -f "$log" ]; then off=$(wc -c < "$log"); fi
printf '\n=== gpudoctor: starting at %s on %s: %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$(uname -n)" "$*" >> "$log" \
  || { echo "cannot write $log"; exit 91; }
if ! command -v "$1" > /dev/null 2>&1; then
  printf '=== gpudoctor: cannot start %s: not found\n' "$1" >> "$log"
  echo "notfound"
  exit 92
fi
setsid nohup sh -c "$w" gpudoctor-bench-server "$pidf" "$rcf" "$@" >> "$log" 2>&1 < /dev/null &
i=0
while [ ! -s "$pidf" ]; do
  i=$((i + 1))
  if [ $i -gt 200 ]; then echo "the server wrapper did not record its pid in 10 s"; exit 93; fi
  sleep 0.05
done
echo "dir=$d"
echo "offset=$off"
echo "pid=$(cat "$pidf")"
"""

# $1 pid, $2 rc file. Prints "rc N", "gone" or "alive".
_GONE = r"""if [ -f "$2" ]; then echo "rc $(cat "$2")"; exit 0; fi
{ read -r s < "/proc/$1/stat"; } 2>/dev/null || { echo gone; exit 0; }
s=${s##*") "}
case $s in Z*|X*) echo gone ;; *) echo alive ;; esac
"""

# $1 process group id, $2 signal (0: none). Sends it to the group, then prints how many live (non-zombie)
# processes the group has.
_GROUP = r"""pg=$1
if [ "$2" != 0 ]; then kill -"$2" -"$pg" 2>/dev/null; fi
n=0
for f in /proc/[0-9]*/stat; do
  { read -r l < "$f"; } 2>/dev/null || continue
  set -- ${l##*") "}
  if [ "$3" = "$pg" ] && [ "$1" != Z ] && [ "$1" != X ]; then n=$((n + 1)); fi
done
echo $n
"""

# $1 run dir. Prints "PIDFILE PID" for every pid file of the run directory.
_LIST = r"""d=$1
case $d in "~/"*) d=$HOME/${d#"~/"} ;; esac
for f in "$d"/*.pid; do
  if [ -f "$f" ]; then printf '%s %s\n' "$f" "$(cat "$f")"; fi
done
"""

# argv: path offset cap. Prints {"size", "start", "skipped", "b"} or {"error"}.
_PY_TAIL = r"""
import base64, json, os, sys
path, off, cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    f = open(path, "rb")
except OSError as e:
    print(json.dumps({"error": e.strerror or str(e)}))
    sys.exit(0)
with f:
    size = os.fstat(f.fileno()).st_size
    start = off if off <= size else 0
    skipped = max(0, size - start - cap)
    f.seek(start + skipped)
    data = f.read(cap)
print(json.dumps({"size": size, "start": start, "skipped": skipped, "b": base64.b64encode(data).decode()}))
"""

WRAPPER_NAME = "gpudoctor-bench-server"


def _exit_text(rc: str) -> str:
    if not rc.strip().isdigit():
        return "server process is gone (its exit status was not recorded)"
    n = int(rc)
    if 128 < n < 128 + 65:
        return f"server process killed by signal {n - 128}"
    return f"server process exited with rc {n}"


class HostLauncher:
    """The server of one configuration on a Host (SSH): detached start, liveness, group stop, log mirror."""

    def __init__(self, host: Host, remote_dir: str, label: str, log_path: str, pid_file: str):
        self.host, self.remote_dir, self.label = host, remote_dir, label
        self.log_path, self.pid_file = log_path, pid_file
        self.pid: int | None = None
        self.dir: str | None = None  # the run directory on the target, absolute (known after start)
        self.offset = 0  # bytes of the remote log already copied
        self.sync_error: str | None = None
        self.log = get_logger("gpudoctor.bench.server.remote", host=host.name, label=label)

    # ---- remote paths -------------------------------------------------------------------------------------------
    @property
    def remote_log(self) -> str:
        return f"{self.dir}/{self.label}.log"

    @property
    def rc_file(self) -> str:
        return f"{self.dir}/{self.label}.rc"

    def wrapper_argv(self, argv: list[str]) -> list[str]:
        """The wrapper's command line as /proc/PID/cmdline shows it (checked before a resumed run kills it)."""
        return ["sh", "-c", _WRAPPER, WRAPPER_NAME, f"{self.dir}/{self.label}.pid", self.rc_file, *argv]

    def _run(self, argv: list[str], timeout: float, *, retry: bool = True):
        """Host.run; an idempotent command is tried once more after a lost connection (SSHHost reconnects)."""
        try:
            return self.host.run(argv, timeout=timeout)
        except HostError:
            if not retry:
                raise
            time.sleep(0.2)
            return self.host.run(argv, timeout=timeout)

    # ---- Launcher -------------------------------------------------------------------------------------------------
    def start(self, argv: list[str], env: dict[str, str]) -> int:
        """Start the server detached on the target; its pid (= process group id). OSError when it cannot start."""
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        res = self.host.run(["sh", "-c", _START, "gpudoctor-bench-start", _WRAPPER, self.remote_dir, self.label,
                             *argv], timeout=30.0, env=env or None)
        out = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        if res.ok and out.get("pid", "").strip().isdigit() and out.get("dir"):
            self.pid, self.dir = int(out["pid"]), out["dir"]
            self.offset = int(out.get("offset", "0").strip() or 0)
            atomic_write(self.pid_file, json.dumps({
                "host": self.host.name, "pid": self.pid, "argv": self.wrapper_argv(argv), "dir": self.dir,
                "log": self.remote_log, "rc_file": self.rc_file}))
            self.log.info("bench.server.started", pid=self.pid, dir=self.dir)
            self.sync_log()
            return self.pid
        if res.rc == 92:
            raise OSError(errno.ENOENT, f"not found on {self.host.name}", argv[0])
        why = "did not answer in 30 s" if res.timed_out else (res.stdout + res.stderr).strip() or f"rc {res.rc}"
        raise OSError(errno.EIO, f"could not start it on {self.host.name}: {why}", argv[0])

    def gone(self) -> str | None:
        """Why the server is no longer running, or None while it runs."""
        if self.pid is None:
            return "not started"
        res = self._run(["sh", "-c", _GONE, "gpudoctor-bench-gone", str(self.pid), self.rc_file], timeout=15.0)
        word = res.stdout.strip()
        if res.timed_out or word == "alive" or not res.ok:
            return None  # cannot tell: a dead server shows up in its requests and readiness anyway
        if word.startswith("rc "):
            return _exit_text(word[3:])
        return _exit_text("")

    def group_alive(self, sig: str = "0") -> int:
        """Live processes left in the server's process group (after sending `sig` to it, unless "0")."""
        res = self._run(["sh", "-c", _GROUP, "gpudoctor-bench-group", str(self.pid), sig], timeout=15.0)
        out = res.stdout.strip()
        return int(out) if res.ok and out.isdigit() else 1

    def stop(self, timeout: float) -> None:
        """SIGTERM the process group; SIGKILL it if anything is left after `timeout`; copy the rest of the log."""
        if self.pid is not None:
            stopped = self._signal_and_wait("TERM", timeout) or self._signal_and_wait("KILL", 10.0)
            self.sync_log()
            if not stopped:
                self.log.warning("bench.server.survived_kill", pid=self.pid)
                return  # keep the pid file: a later --resume tries again
        try:
            fs.fs_unlink(self.pid_file)
        except FileNotFoundError:
            pass

    def _signal_and_wait(self, sig: str, wait: float) -> bool:
        end = time.monotonic() + wait
        left = self.group_alive(sig)
        while left and time.monotonic() < end:
            time.sleep(0.1)
            left = self.group_alive()
        return left == 0

    def sync_log(self) -> None:
        """Append what the remote log gained since the last copy to the local mirror (never raises)."""
        if self.dir is None:
            return
        try:
            res = self._run(python_argv(self.host.python, "-c", _PY_TAIL, self.remote_log, str(self.offset),
                                        str(SYNC_CAP)),
                            timeout=30.0)
            d = json.loads(res.stdout) if res.ok else {"error": res.describe()}
        except (HostError, ValueError) as exc:
            d = {"error": str(exc)}
        with open(self.log_path, "ab") as mirror:
            if "error" in d:
                if d["error"] != self.sync_error:
                    mirror.write(f"=== gpudoctor: could not copy {self.remote_log} from {self.host.name}: "
                                 f"{d['error']}\n".encode())
                self.sync_error = d["error"]
                return
            self.sync_error = None
            if d["start"] < self.offset:
                mirror.write(f"=== gpudoctor: {self.remote_log} shrank on {self.host.name}; copying it from its "
                             "start\n".encode())
            if d["skipped"]:
                mirror.write(f"=== gpudoctor: {d['skipped']} bytes of {self.remote_log} not copied (more than "
                             f"{SYNC_CAP} since the last copy)\n".encode())
            data = base64.b64decode(d["b"])
            mirror.write(data)
            self.offset = d["start"] + d["skipped"] + len(data)


def reap_remote_orphan(host: Host, info: dict, timeout: float) -> str | None:
    """Stop a server a killed campaign left on the target (its pid file survived); what was done, or None.

    The process must still be the wrapper we started (its /proc/PID/cmdline equals the recorded argv): a pid that
    was reused since is left alone.
    """
    try:
        pid = int(info["pid"])
        argv = [str(a) for a in info["argv"]]
    except (KeyError, TypeError, ValueError):
        return None
    res = host.run(["cat", f"/proc/{pid}/cmdline"], timeout=15.0)
    if res.ok and res.stdout and res.stdout.split("\0")[:-1] != argv:
        return None  # the pid belongs to another process now
    launcher = HostLauncher(host, "", "", os.devnull, os.devnull)
    launcher.pid = pid
    # A dead or zombie wrapper (empty cmdline) may leave its server running in group PID; Linux never hands out a
    # pid that is still a process group's id, so a live member of group PID is ours.
    if launcher.group_alive() == 0:
        return None
    if launcher._signal_and_wait("TERM", timeout) or launcher._signal_and_wait("KILL", 10.0):
        return f"stopped server left running on {host.name} by an interrupted campaign (pid {pid})"
    return f"could not stop server left running on {host.name} by an interrupted campaign (pid {pid})"


def reap_run_dir(host: Host, remote_dir: str, timeout: float) -> list[str]:
    """Stop every server still running from a run directory on the target (what was done, one line each).

    This finds a server whose start was cut short before gpudoctor recorded it locally (killed between the
    remote start and writing DIR/server.pid): only processes whose command line is our wrapper with that very
    pid file are touched.
    """
    res = host.run(["sh", "-c", _LIST, "gpudoctor-bench-list", remote_dir], timeout=15.0)
    notes = []
    for line in res.stdout.splitlines() if res.ok else []:
        pid_file, _, pid = line.rpartition(" ")
        if not pid.isdigit():
            continue
        got = host.run(["cat", f"/proc/{pid}/cmdline"], timeout=15.0)
        argv = got.stdout.split("\0")[:-1] if got.ok else []
        if argv[:5] != ["sh", "-c", _WRAPPER, WRAPPER_NAME, pid_file]:
            continue
        note = reap_remote_orphan(host, {"pid": pid, "argv": argv}, timeout)
        if note:
            notes.append(note)
    return notes
