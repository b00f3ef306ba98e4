"""A stand-in torch without CUDA in a venv of its own, for the deep tier's timing (its child runs `python -I`, so
only that venv's site counts): its import takes IMPORT_S seconds, as torch's does, and its NCCL probe returns at once.
Used by tests/core/test_deep_timeline.py and bench/deep_phases.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TORCH = '''
import time
time.sleep(IMPORT_S)  # torch's import, by its length
__version__ = "0.0-standin"
float32 = "f32"
class _Cuda:
    def is_available(self): return False
    def set_device(self, d): pass
    def synchronize(self, *a): pass
    class nccl:
        @staticmethod
        def version(): return (2, 0, 0)
cuda = _Cuda()
def ones(n, dtype=None, device=None): return n
from . import distributed
'''
DISTRIBUTED = '''
def init_process_group(backend, init_method, rank, world_size): pass
def all_reduce(x): pass
def barrier(): pass
def destroy_process_group(): pass
'''


def make(venv: Path, import_s: float) -> str:
    """The venv at VENV with the stand-in torch (and the dist-info a search asks importlib.metadata for, without
    importing it); returns its python3."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True)
    site = Path(out.stdout.strip())
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(f"IMPORT_S = {import_s!r}\n" + TORCH)
    (site / "torch" / "distributed.py").write_text(DISTRIBUTED)
    (site / "torch-0.0.dist-info").mkdir()
    (site / "torch-0.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 0.0\n")
    return str(venv / "bin" / "python3")
