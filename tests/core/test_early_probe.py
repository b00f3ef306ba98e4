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
from gpudoctor.cuda_probe import FAST, PROBE

PROBE_ARGV = (sys.executable, *FAST, "-c", PROBE)


def test_the_probe_starts_before_click_or_the_cli_is_imported():
    code = (
        "import sys, json\n"
        "import gpudoctor.entry\n"
        "import gpudoctor.host.early as e\n"
        "e.start_probes(['check', '--json'])\n"
        "loaded = sorted(m for m in ('click', 'gpudoctor.cli', 'gpudoctor.gather', 'gpudoctor.host.base') if m in sys.modules)\n"
        "(proc, t0), = [v for k, v in e.EARLY.items() if '-I' in k]\n"
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
                                       ([], False)])
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
    spawns = [i for i, e in enumerate(events) if e[0] == "spawn"]
    assert spawns and events[spawns[0]][1] == list(PROBE_ARGV), events[:5]  # the first process: the cuInit probe
    imports = [i for i, e in enumerate(events) if e[0] == "import"]
    assert {events[i][1] for i in imports} == {"click", "gpudoctor.cli"}, events  # both do load, after it
    assert spawns[0] < min(imports), events[:5]
