"""Which python the deep tier measures with (#33), through the installed command: the serving stack's interpreter,
found by itself and said in the evidence; without torch the rest is marked not measured and why, never a traceback.

The python with torch is the transformers lab's venv (tests/bench/transformers_lab.py: torch CPU, real); the "server"
is a script named `transformers` run with `serve`, whose `#!` line is that venv's python — what /proc shows for a
real `transformers serve`. There is no GPU here, so the children find none: the choice is what is asserted, live and
replayed from the snapshot that recorded it.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.bench.transformers_lab import venv_for_tests
from tests.console import gpudoctor
from tests.needs import unavailable

ENV = {"PATH": "/usr/bin:/bin", "GPUDOCTOR_INVENTORY": "", "HOME": "/tmp"}


@pytest.fixture
def lab_python():
    return str(venv_for_tests() / "bin" / "python")  # the lab's one entry: elsewhere, opt-in, or built


@pytest.fixture
def serving(tmp_path, lab_python):
    """A process that looks to /proc as `transformers serve` does: the lab venv's python running a script."""
    script = tmp_path / "transformers"
    script.write_text(f"#!{lab_python}\nimport time\ntime.sleep(120)\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "serve", "--port", "0"], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if b"serve" in open(f"/proc/{proc.pid}/cmdline", "rb").read():
                break
        except OSError:
            pass
        time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def snapshot(tmp_path, *extra):
    out = tmp_path / "deep.json"
    r = gpudoctor("snapshot", "--deep", "-o", out, *extra, env=ENV, cwd=tmp_path, timeout=120)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert out.is_file(), r.stderr
    return json.loads(out.read_text())


def test_the_deep_tier_picks_the_serving_stacks_python_and_the_replay_picks_it_again(tmp_path, serving,
                                                                                     lab_python):
    doc = snapshot(tmp_path)
    pick = doc["facts"]["deep"]["python"]
    # the first server in pid order: ours, or a real `transformers serve` of the lab running now (the same venv,
    # started as bin/python or bin/python3)
    assert len(pick["python"]) == 1 and Path(pick["python"][0]).parent == Path(lab_python).parent
    assert pick["source"].startswith("the transformers serve server's interpreter (pid ")
    assert pick["torch"].startswith("2.") and "cpu" in pick["torch"]
    assert f"python {pick['python'][0]} (the transformers serve server's interpreter" in pick["evidence"]
    serving.kill()  # the replay answers from the transcript: the server need not run any more
    serving.wait()
    from gpudoctor.target import snapshot_facts

    again = snapshot_facts(doc)["deep"]["python"]
    assert again["python"] == pick["python"] and again["torch"] == pick["torch"]


def test_an_explicit_python_without_torch_measures_copies_and_says_what_it_cannot(tmp_path):
    """`--deep-python` names a python without torch: no search, no NCCL probe run (it would only fail to import)."""
    doc = snapshot(tmp_path, "--deep-python", "/usr/bin/python3")
    pick = doc["facts"]["deep"]["python"]
    assert pick["python"] == ["/usr/bin/python3"] and pick["torch"] is None and pick["source"] == "--deep-python"
    assert pick["why"] == "--deep-python /usr/bin/python3: no torch installed"


def test_the_nccl_probe_is_not_run_without_torch_and_says_why(tmp_path):
    """nvidia-smi stood in with the H200's own topology (one GPU): the TP1 group is not measured, as information."""
    from gpudoctor.diagnose import diagnose
    from gpudoctor.gather import gather
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.host.local import LocalHost

    from .test_deep_h200_replay import H200

    rec = json.loads((H200 / "h200-deep-healthy.snapshot.json").read_text())["transcript"]
    topo = rec['["run",["nvidia-smi","topo","-m"]]']["stdout"]
    (tmp_path / "topo.txt").write_text(topo)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$1" in
  topo) cat {tmp_path}/topo.txt ;;
  --query-gpu=*) printf '0, 00000000:00:06.0, NVIDIA H200\\n' ;;
  *) exit 0 ;;
esac
""")
    smi.chmod(0o755)
    ctx = GatherContext(name="here", policy={"deep": True, "torch_python": "/usr/bin/python3"}, timeout=10)
    host = LocalHost(path_prepend=[str(tmp_path)])
    facts = gather(host, ctx, only={"deep"})
    group = facts["deep"]["groups"][0]
    assert group["gpus"] == ["GPU0"] and "error" not in group
    assert group["not_measured"] == ("NCCL all-reduce needs torch: --deep-python /usr/bin/python3: no torch "
                                     "installed (`--deep-python PATH` names one)")
    f = next(f for f in diagnose(facts).findings if f.id == "fabric.nccl.allreduce")
    assert f.status.value == "info" and f.summary.startswith("TP1:0: not measured: NCCL all-reduce needs torch")


def test_without_any_python_with_torch_the_search_names_what_it_tried(tmp_path):
    """As README line 1 installs it (gpudoctor's venv has no torch) with python3 on PATH lacking it too."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink("/usr/bin/python3", bindir / "python3")
    from gpudoctor.gather.context import GatherContext
    from gpudoctor.gather.deep_python import choose
    from gpudoctor.host.local import LocalHost

    pick = choose(LocalHost(path_prepend=[str(bindir)]), GatherContext(name="here", policy={"deep": True}))
    servers = [c for c in pick["candidates"] if "server's interpreter" in c["source"]]
    if any(c.get("torch") for c in servers):
        unavailable("a real SGLang/vLLM/transformers server with torch runs on this machine now: the python search "
                    "finds it first")
    assert pick["torch"] is None and pick["python"] == LocalHost().python
    assert "python3 (python3 on PATH): no torch installed" in pick["why"]


def test_the_inventory_names_the_deep_python(lab_python):
    """`policy: checks: fabric.deep.figure: {python: PATH}` is a candidate before python3 on PATH."""
    from gpudoctor.gather.context import GatherContext, policy_from_inventory
    from gpudoctor.gather.deep_python import choose
    from gpudoctor.host.local import LocalHost

    pol = policy_from_inventory({"checks": {"fabric.deep.figure": {"python": lab_python}}})
    pick = choose(LocalHost(), GatherContext(name="here", policy={"deep": True, **pol}))
    if "server's interpreter" in pick["source"]:
        unavailable("a real SGLang/vLLM/transformers server with torch runs on this machine now: the python search "
                    "finds it first")
    assert pick["python"] == [lab_python] and pick["source"] == "the inventory's policy" and pick["torch"]
