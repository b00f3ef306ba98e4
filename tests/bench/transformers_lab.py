"""A real third-party OpenAI-compatible server for the suite: Hugging Face `transformers serve` on 127.0.0.1.

It runs in its own venv (torch CPU, transformers[serving], requests, tokenizers), built once under a cache dir keyed
on the versions, the way a user installs it (`python3 -m venv`, `pip install`). The model is a tiny random-weight
Llama and a tokenizer trained here (tests/bench/tfserve_model.py): nothing is downloaded (HF_HUB_OFFLINE=1), and the
HF cache is an empty temp dir, so GET /v1/models lists no model, as on a server started on a directory.

`python -m tests.bench.transformers_lab build` builds the venv (.ci/run does, and times it); `ensure_venv()` builds it
when missing and returns None (with why) when it cannot be built: the lab then skips with one line, or fails under
CI=true. The build is heavy where pip gets torch from PyPI (its Linux wheel is the CUDA build: 4.9 GB in the cache,
146 s, #34), so outside CI a missing venv is built only on request (OPT_IN=1, or the `build` command): README line 2
never downloads gigabytes unasked.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TORCH = "2.13.0"
TRANSFORMERS = "5.17.0"
PACKAGES = (f"torch=={TORCH}", f"transformers[serving]=={TRANSFORMERS}", "requests", "tokenizers")
CACHE = Path(os.environ.get("GPUDOCTOR_TEST_CACHE", "/var/cache/gpudoctor-tests"))
OPT_IN = "GPUDOCTOR_TEST_TFSERVE"
COST = ("the transformers serve lab builds a venv with torch (from PyPI the CUDA build: about 5 GB under "
        f"{CACHE}, 2-3 min)")
HERE = Path(__file__).resolve().parent


def venv_dir() -> Path:
    key = hashlib.sha256(" ".join((*PACKAGES, sys.version.split()[0])).encode()).hexdigest()[:12]
    return CACHE / f"tfserve-venv-{TRANSFORMERS}-{key}"


def venv_ok(venv: Path) -> bool:
    return (venv / ".complete").is_file() and (venv / "bin" / "transformers").is_file()


def build_venv(venv: Path, log=None) -> str | None:
    """Create the venv and install PACKAGES; None when it worked, else the last lines of what failed. The marker
    file is written last: a venv without it (an interrupted build) is removed and built again."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(venv, ignore_errors=True)
    steps = ([sys.executable, "-m", "venv", str(venv)],
             [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *PACKAGES])
    for argv in steps:
        p = subprocess.run(argv, capture_output=True, text=True)
        if log is not None:
            log.write(p.stdout + p.stderr)
        if p.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = " | ".join(x for x in (p.stdout + p.stderr).strip().splitlines()[-3:])
            return f"{' '.join(argv[:3])} ... failed (rc {p.returncode}): {tail}"
    (venv / ".complete").write_text(" ".join(PACKAGES) + "\n")
    return None


def ensure_venv() -> tuple[Path | None, str | None]:
    venv = venv_dir()
    if venv_ok(venv):
        return venv, None
    why = build_venv(venv)
    if why is None and venv_ok(venv):
        return venv, None
    return None, why or f"{venv} is incomplete"


def venv_for_tests() -> Path:
    """The lab venv for a test fixture: outside CI a venv not built yet is built only on request (gigabytes:
    needs.opt_in skips with one line naming OPT_IN); one that cannot be built skips (fails under CI=true)."""
    from tests import needs

    needs.elsewhere("transformers-lab")
    if not venv_ok(venv_dir()):
        needs.opt_in(OPT_IN, COST)
    venv, why = ensure_venv()
    if venv is None:
        needs.unavailable(f"the transformers serve lab venv cannot be built here ({why}) (tests that need it are "
                          "skipped)")
    return venv


def served(tmp_path_factory):
    """A module fixture's body: one real transformers serve on a tiny model for the module's tests, stopped after."""
    import pytest

    venv = venv_for_tests()
    work = tmp_path_factory.mktemp("tfserve")
    model, hf_home = work / "tiny-llama", work / "hf"
    build_model(venv, model, hf_home)
    server = Server(venv, model, hf_home, work / "serve.log")
    try:
        why = server.wait_up()
        if why:
            pytest.fail(why, pytrace=False)
        yield server
    finally:
        server.stop()


def python(venv: Path) -> str:
    return str(venv / "bin" / "python")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline_env(hf_home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update({"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1", "NO_COLOR": "1"})
    return env


def build_model(venv: Path, out: Path, hf_home: Path) -> None:
    subprocess.run([python(venv), str(HERE / "tfserve_model.py"), str(out)], check=True, capture_output=True,
                   env=offline_env(hf_home), timeout=300)


class Server:
    """`transformers serve MODEL_DIR --continuous-batching` on a free loopback port, in its own process group."""

    def __init__(self, venv: Path, model: Path, hf_home: Path, log: Path, *, max_batch_tokens: int = 512,
                 continuous_batching: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model, self.log = model, log
        (hf_home / "hub").mkdir(parents=True, exist_ok=True)  # an empty cache: GET /v1/models lists nothing
        argv = [str(venv / "bin" / "transformers"), "serve", str(model), "--host", "127.0.0.1",
                "--port", str(self.port), "--device", "cpu", "--dtype", "float32", "--log-level", "warning"]
        if continuous_batching:
            argv += ["--continuous-batching", "--cb-num-blocks", "128", "--cb-block-size", "32",
                     # without a cap transformers sizes each batch's buffers from the machine's free memory: 21.6 GiB
                     # of RSS on a 24 GiB CI machine for a 2-layer model (measured); capped, 0.4 GiB
                     "--cb-max-batch-tokens", str(max_batch_tokens)]
        self.argv = argv
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                         env=offline_env(hf_home), start_new_session=True)

    def wait_up(self, deadline: float = 120.0) -> str | None:
        """None once GET /health answers 200 (the model is loaded before the server listens), else why not."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return f"transformers serve exited with rc {self.proc.returncode}: {self.tail()}"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return None
            except OSError:
                pass
            time.sleep(0.2)
        return f"transformers serve did not answer /health in {deadline:g} s: {self.tail()}"

    def tail(self, n: int = 5) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.proc.wait(timeout=10)


def main(argv: list[str]) -> int:
    if argv[:1] != ["build"]:
        print("usage: python -m tests.bench.transformers_lab build", file=sys.stderr)
        return 3
    venv = venv_dir()
    if venv_ok(venv):
        print(f"transformers lab venv: {venv} (cached)")
        return 0
    t0 = time.monotonic()
    why = build_venv(venv)
    if why:
        print(f"transformers lab venv: {why}", file=sys.stderr)
        return 1
    print(f"transformers lab venv: {venv} built in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
