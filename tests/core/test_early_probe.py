"""A live local check starts its cuInit probe before anything heavy is imported (#28: on the H200 the probe started
only after the CLI's imports, and check took 1.43x a bare cuInit subprocess): gpudoctor/entry.py, the console script's
entry, spawns it first through gpudoctor/host/early.py (stdlib only); the check's cuda gather adopts that process
instead of starting another."""

import json
import subprocess
import sys

import pytest

from gpudoctor import entry
from gpudoctor.host import early
from gpudoctor.cuda_probe import PROBE
# Written out, not computed with host/childpy.py's python_argv (the code under test): the probe runs this python
# isolated (-I: no PYTHON* variables, no script or working directory on sys.path) and without site (-S).
PROBE_ARGV = (sys.executable, "-I", "-S", "-c", PROBE)


def test_the_probe_starts_before_click_or_the_cli_is_imported():
    code = (
        "import sys, json\n"
        "import gpudoctor.entry\n"
        "import gpudoctor.host.early as e\n"
        "e.start_probes(['check', '--json'])\n"
        "loaded = sorted(m for m in ('click', 'gpudoctor.cli', 'gpudoctor.checks', 'gpudoctor.host.local') if m in sys.modules)\n"
        "first, (proc, t0) = next(iter(e.EARLY.items()))\n"
        "assert 'cuInit' in first[-1], first  # spawned first: the gathers' probes' imports come after it\n"
        "out = proc.communicate(timeout=60)[0]\n"
        "print(json.dumps({'loaded': loaded, 'probe': json.loads(out)}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["loaded"] == []
    assert "cuinit" in doc["probe"] or "dlopen_error" in doc["probe"]  # the real probe ran (no GPU: no libcuda here)


@pytest.mark.parametrize("args,live", [(["check"], True), (["gate", "--profile", "x"], True), (["check", "--json"], True),
                                       (["check", "--host", "h"], False), (["check", "--snapshot=f"], False),
                                       (["check", "--all"], False), (["snapshot"], False), (["check", "-h"], False),
                                       ([], False), (["-vv", "check", "--json"], True), (["--verbose", "gate"], True),
                                       (["-v", "check", "--host", "h"], False), (["-vv"], False)])
def test_only_a_live_local_check_starts_probes(args, live):
    assert early.is_live_check(args) is live


def test_the_check_adopts_the_early_probe(capsys, monkeypatch):
    monkeypatch.setattr(early, "EARLY", {})
    from gpudoctor.host import local

    monkeypatch.setattr(local, "_PRESTARTED", early.EARLY)
    early.start_probes(["check", "--json"])
    proc, _ = early.EARLY[PROBE_ARGV]
    with pytest.raises(SystemExit):
        entry.main(["check", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert PROBE_ARGV not in early.EARLY  # taken by the cuda gather, not left to be killed at exit
    assert proc.returncode == 0  # it ran to its end (an unadopted one is killed: -9)
    assert any(f["id"] == "cuda.init" for f in doc["findings"])
    early.kill_unadopted()


ADOPTION = """
import json, sys
import gpudoctor.host.early as e
import gpudoctor.entry
gpudoctor.entry.start_probes(sys.argv[1:])
spawned = [k for k in e.EARLY if 'cuInit' not in k[-1]]
from gpudoctor.gather import fabric, kernel_log, procs, tools
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost
ctx = GatherContext(name='t', timeout=float(sys.argv[sys.argv.index('--timeout') + 1]) if '--timeout' in sys.argv else 10.0)
ctx.policy = json.loads('%s')
host = LocalHost()
out = {k: m.gather(host, ctx) for k, m in (('procs', procs), ('kernel_log', kernel_log), ('fabric', fabric), ('tools', tools))}
left = [(k, p) for k, (p, _) in e.EARLY.items() if 'cuInit' not in k[-1]]
e.kill_unadopted()
print(json.dumps({'spawned': len(spawned), 'left': [k[4][:20] for k, _ in left],
                  'killed': [p.returncode for _, p in left], 'ok': {k: 'error' not in (v or {}) for k, v in out.items()}}))
"""


@pytest.mark.parametrize("args", [["check", "--json"], ["-vv", "check"], ["gate", "--timeout", "2"]])
def test_the_gathers_adopt_their_probes_started_at_entry(args):
    """#33: the process scan, the kernel log reader, the sysfs probe and the tool probe start at CLI entry (gather/prestart.py) and
    each gather adopts its own: the argv built there is the one the gather builds (nothing left to kill)."""
    r = subprocess.run([sys.executable, "-c", ADOPTION % "{}", *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["spawned"] == 4 and doc["left"] == []
    assert doc["ok"] == {"procs": True, "kernel_log": True, "fabric": True, "tools": True}


def test_a_context_known_only_later_runs_the_gathers_own_probe_and_the_early_one_is_killed():
    """An inventory's policy (here a kernel log window) is read after entry: the early kernel log reader's argv is not
    the gather's, so the gather runs its own, and the unadopted one is killed at exit, not left behind."""
    pol = json.dumps({"checks": {"driver.xid": {"window": 3600}}})
    r = subprocess.run([sys.executable, "-c", ADOPTION % pol, "check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["spawned"] == 4 and doc["ok"]["kernel_log"]
    assert len(doc["left"]) == 1 and doc["left"][0].startswith("\nimport collections")  # the kmsg reader's program
    assert doc["killed"] == [-9] or doc["killed"] == [0]  # killed (or it had already ended); reaped either way


FORKED = """
import json, subprocess, sys, threading, time
from gpudoctor.host.forked import Forked, can_fork
from gpudoctor.host.local import LocalHost
import gpudoctor.host.early as e
import gpudoctor.entry
out = {'can_fork': can_fork()}
gpudoctor.entry.start_probes(['check', '--json'])
first, (proc, _) = next(iter(e.EARLY.items()))
out['cuinit_kind'] = type(proc).__name__
out['cuinit'] = sorted(json.loads(LocalHost().run(list(first), timeout=60).stdout))
e.kill_unadopted()
ok = Forked(['p'], 'import sys; print("out"); print("err", file=sys.stderr); raise SystemExit(4)')
o, r = ok.communicate(timeout=30)
out['answer'] = [o.decode(), r.decode(), ok.returncode]
bad = Forked(['p'], 'raise ValueError("boom")')
o, r = bad.communicate(timeout=30)
out['raised'] = [bad.returncode, 'ValueError: boom' in r.decode()]
hang = Forked(['p'], 'import time; print("started", flush=True); time.sleep(60)')
t = time.monotonic()
res = LocalHost()._finish(hang, ['p'], 0.5, time.perf_counter(), None, 0.5)
out['hang'] = [res.timed_out, hang.returncode, round(time.monotonic() - t, 1) < 5]
import os
real_exit = os._exit
os._exit = lambda code: (time.sleep(3), real_exit(code))  # a slow exit (cuInit's teardown), inherited by the fork
slow = Forked(['p'], 'print("done")')
os._exit = real_exit
t = time.monotonic()
o, _ = slow.communicate(timeout=30)
waited = time.monotonic() - t
try:  # still in its exit when the answer was taken
    alive = os.waitpid(slow.pid, os.WNOHANG)[0] == 0
except ChildProcessError:
    alive = False
slow.kill()
out['teardown'] = [o.decode(), slow.returncode, waited < 1.5, alive]
threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
out['can_fork_with_threads'] = can_fork()
print(json.dumps(out))
"""


def test_the_cuinit_probe_runs_in_a_fork_with_the_spawned_ones_answer_and_deadline():
    """#33: the cuInit probe is a fork of the console script at entry (no second interpreter to start); it answers
    what `python -I -S -c PROBE` answers, keeps its exit code and traceback, and a hang is killed at its deadline.
    With another thread running, forking is not safe: early.py spawns the interpreter instead. The answer and exit
    code are taken when the program has run; the child's own exit (on a GPU, the driver's teardown) is not waited for."""
    r = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    spawned = subprocess.run(list(PROBE_ARGV), capture_output=True, text=True, timeout=60)
    assert doc["can_fork"] and doc["cuinit_kind"] == "Forked"
    assert doc["cuinit"] == sorted(json.loads(spawned.stdout))  # the same keys (no GPU here: the dlopen error)
    assert doc["answer"] == ["out\n", "err\n", 4]
    assert doc["raised"] == [1, True]
    assert doc["hang"] == [True, -9, True]
    # the answer is collected once the program has run, not after the process's exit (cuInit's teardown: tens of ms)
    assert doc["teardown"] == ["done\n", 0, True, True]
    assert doc["can_fork_with_threads"] is False


def test_the_console_entry_starts_the_probe_before_click_and_the_cli_load():
    """The installed console script's own entry point (`gpudoctor = gpudoctor.entry:main`, loaded through its entry
    point as the script does) runs a live `check --json`; the interpreter's audit hooks write, as they happen, every
    import of click or the CLI and every process started: the cuInit probe must come first (#35, M3: importing
    gpudoctor.cli before start_probes is the #28 regression, which the test above cannot see). Each event is written
    at once: a live check leaves through os._exit, past any code after main()."""
    code = (
        "import json, os, sys\n"
        "from importlib.metadata import entry_points\n"
        "def hook(ev, args):\n"
        "    if ev == 'import' and args[0] in ('click', 'gpudoctor.cli'):\n"
        "        os.write(2, ('\\nEVENT ' + json.dumps(['import', args[0]]) + '\\n').encode())\n"
        "    elif ev == 'subprocess.Popen':\n"
        "        os.write(2, ('\\nEVENT ' + json.dumps(['spawn', [str(a) for a in args[1]]]) + '\\n').encode())\n"
        "    elif ev == 'os.fork':\n"
        "        os.write(2, ('\\nEVENT ' + json.dumps(['fork', []]) + '\\n').encode())\n"
        "(ep,) = [e for e in entry_points(group='console_scripts') if e.name == 'gpudoctor']\n"
        "assert ep.value == 'gpudoctor.entry:main', ep.value\n"
        "sys.addaudithook(hook)\n"
        "main = ep.load()\n"
        "sys.argv = ['gpudoctor', 'check', '--json']\n"
        "main()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert r.returncode in (0, 1, 2, 3), r.stderr[-2000:]  # the check ran to its verdict (no GPU here: 2 or 3)
    assert any(f["id"] == "cuda.init" for f in json.loads(r.stdout)["findings"])
    events = [json.loads(ln[len("EVENT "):]) for ln in r.stderr.splitlines() if ln.startswith("EVENT ")]
    spawns = [i for i, e in enumerate(events) if e[0] in ("spawn", "fork")]
    # the first process: the cuInit probe — a fork of this script (host/forked.py), or PROBE_ARGV where it cannot fork
    assert spawns and (events[spawns[0]][0] == "fork" or events[spawns[0]][1] == list(PROBE_ARGV)), events[:5]
    imports = [i for i, e in enumerate(events) if e[0] == "import"]
    assert {events[i][1] for i in imports} == {"click", "gpudoctor.cli"}, events  # both do load, after it
    assert spawns[0] < min(imports), events[:5]
