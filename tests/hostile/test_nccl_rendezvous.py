"""#40 item 3: the deep tier's NCCL rendezvous is a file in a private directory made for the run (mktemp -d: 0700, a
fresh name), never a fixed name in /tmp that another user can make first (as a link to a root file, or a FileStore
they feed). A stand-in torch records where its ranks met; the attacker's planted name is left alone and unused."""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

from gpudoctor.gather import deep
from gpudoctor.gather.context import GatherContext
from gpudoctor.host.local import LocalHost
from tests.hostile.planted import as_attacker, digest, victim  # noqa: F401 - fixtures

FAKE_TORCH = '''
import json, os
class _Cuda:
    def set_device(self, d): pass
    def synchronize(self): pass
    class nccl:
        @staticmethod
        def version(): return (2, 0, 0)
cuda = _Cuda()
float32 = "f32"
def ones(n, dtype=None, device=None): return n
'''
FAKE_DIST = '''
import json, os
def init_process_group(backend, init_method, rank, world_size):
    path = init_method[len("file://"):]
    d = os.path.dirname(path)
    st = os.stat(d)
    with open(RDV_LOG + "." + str(rank), "w") as fh:
        json.dump({"path": path, "dir_mode": st.st_mode & 0o7777, "dir_uid": st.st_uid}, fh)
    open(path, "a").close()
def all_reduce(x): pass
def barrier(): pass
def destroy_process_group(): pass
'''


def test_the_rendezvous_lies_in_a_private_fresh_directory(tmp_path, victim):
    # an interpreter with "torch" in its own site-packages: a venv, since the deep child runs `python -I` (no
    # PYTHONPATH, no user site) in a minimal environment
    import subprocess
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH + "from . import distributed\n")
    (site / "torch" / "distributed.py").write_text(f"RDV_LOG = {str(tmp_path / 'rdv')!r}\n" + FAKE_DIST)
    py = venv / "bin" / "python3"
    tmp = Path(tempfile.gettempdir())
    fixed = tmp / ".gpudoctor-nccl-0_1"  # where main met, a name anyone can make first
    before = digest(victim)
    planted = not os.path.lexists(fixed)
    if planted:
        as_attacker(lambda: fixed.symlink_to(victim))
    try:
        rec = deep._measure(LocalHost(name="gpu1"), [str(py)], 2, {"gpus": ["GPU0", "GPU1"], "worst_link": "NV18",
                                                                    "numa_nodes": []}, 1 << 20,
                            GatherContext(name="gpu1", timeout=30))
        assert rec.get("error") is None, rec
        seen = [json.loads((tmp_path / f"rdv.{r}").read_text()) for r in (0, 1)]
        assert seen[0]["path"] == seen[1]["path"]
        d = os.path.dirname(seen[0]["path"])
        assert seen[0]["dir_mode"] == 0o700 and seen[0]["dir_uid"] == os.geteuid()
        assert os.path.realpath(seen[0]["path"]) != os.path.realpath(fixed) and d != str(tmp)
        assert not os.path.exists(d)  # removed after the run
        if planted:
            assert fixed.is_symlink() and os.lstat(fixed).st_uid == 65534  # not removed, not replaced, not used
        assert digest(victim) == before
    finally:
        if planted and fixed.is_symlink():
            fixed.unlink()
