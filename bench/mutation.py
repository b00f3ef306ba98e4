#!/usr/bin/env python3
"""Mutation score of the code that changes a host or decides a verdict (#35): each module is broken one small way at
a time (a comparison flipped, a condition negated, a call or a raise dropped, a constant changed) and the tests that
reach the broken line are run against it; a mutant no test fails is a survivor, printed with its line.

Usage (not in CI's time budget; the interpreter is the one the tests run with, README line 2's venv):
    "$(./install.sh --where)/bin/python" bench/mutation.py                 # every module below
    .../python bench/mutation.py files/edit integrations/slurm --jobs 2    # some of them
    .../python bench/mutation.py --list                                    # the modules, their tests, mutant counts

How, and why not mutmut: the tests import the INSTALLED package (tests/conftest.py takes the checkout off sys.path;
`checks/` and `remedies/` become gpudoctor.checks/gpudoctor.remedies only when installed) and many run the CLI as a
child process. mutmut 3.x mutates a copy of the source tree (`mutants/`) and switches mutants inside the test process,
so under this suite every mutant ran against the unmutated installed package (measured on files/edit.py: see
docs/testing.md). Here each worker builds the installed layout once (a venv whose site-packages hold gpudoctor, with
checks/ and remedies/ inside) and runs the tests with its python, so the test process and its children (`python -I`
too) import the mutant. A first run of the module's tests with a line tracer (a module its .pth imports, in that
tree, in the children too) records which test reaches which line; each mutant then runs only those tests (`-x`), or
all of the module's tests when no test was seen reaching it. The mutant source is the module's syntax tree, mutated
and unparsed; the unmutated tree must unparse to the same code (checked). Equivalent survivors: docs/testing.md.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Ctrl-C or SIGTERM: the test runs (each in a session of its own, so the signal never reaches them) are killed by
# process group and no further mutant starts, so the run ends within a second and removes its trees
_STOP = threading.Event()
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.RLock()  # the signal handler runs in the main thread, which may hold it


class Stopped(Exception):
    """The run was interrupted: no further test run starts."""


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    _STOP.set()
    with _LIVE_LOCK:
        for p in list(_LIVE):
            _kill_group(p)
LAYOUT = {"gpudoctor": "gpudoctor", "checks": "gpudoctor/checks", "remedies": "gpudoctor/remedies"}  # pyproject

# module name -> (source file in the checkout, the tests that exercise it: fast ones, no lab that boots a system)
MODULES: dict[str, tuple[str, list[str]]] = {
    "files/edit": ("gpudoctor/files/edit.py", ["tests/remedies/test_edit.py", "tests/remedies/test_edit_breaks.py",
                                               "tests/host/test_write_ops.py",
                                               "tests/remedies/test_sysctl.py", "tests/boundary/test_systemd_unit.py"]),
    "files/atomic": ("gpudoctor/files/atomic.py", ["tests/core/test_atomic_write.py", "tests/model/test_model_stage.py",
                                                   "tests/fleet/test_promfile.py"]),
    "integrations/slurm": ("gpudoctor/integrations/slurm.py", ["tests/gate/test_slurm_states.py",
                                                               "tests/gate/test_slurm_reads.py",
                                                               "tests/gate/test_slurm_npd.py"]),
    "gate": ("gpudoctor/gate.py", ["tests/gate/test_gate.py", "tests/gate/test_slurm_npd.py"]),
    "campaign/slurm": ("gpudoctor/campaign/slurm.py", ["tests/bench/test_slurm_submitter.py",
                                                                   "tests/bench/test_slurm_campaign_file.py"]),
    "bench/records/stats": ("gpudoctor/bench/records/stats.py", ["tests/bench/test_report.py",
                                                                 "tests/bench/test_health.py"]),
    "bench/records/trust": ("gpudoctor/bench/records/trust.py", ["tests/bench/test_report.py",
                                                                 "tests/bench/test_health.py"]),
    "remedies/common": ("remedies/common.py", ["tests/remedies/test_engine.py", "tests/remedies/test_fix_command.py"]),
    "remedies/devnodes": ("remedies/devnodes.py", ["tests/remedies/test_fix_command.py",
                                                   "tests/remedies/test_engine.py"]),
    "remedies/lxc_cgroup": ("remedies/lxc_cgroup.py", ["tests/remedies/test_lxc_cgroup.py"]),
    "remedies/sysctl": ("remedies/sysctl.py", ["tests/remedies/test_sysctl.py"]),
    "remedies/systemd_unit": ("remedies/systemd_unit.py", ["tests/boundary/test_systemd_unit.py"]),
    "remedies/cdi": ("remedies/cdi.py", ["tests/boundary/test_cdi.py"]),
    "remedies/persistence": ("remedies/persistence.py", ["tests/remedies/test_persistence.py"]),
    "remedies/pcie": ("remedies/pcie.py", ["tests/remedies/test_pcie.py"]),
    "remedies/model_stage": ("remedies/model_stage.py", ["tests/remedies/test_model_stage.py"]),
    "remedies/bench_orphans": ("remedies/bench_orphans.py", ["tests/core/test_workload_hygiene.py"]),
    "recovery/ladder": ("gpudoctor/recovery/ladder.py", ["tests/recovery/test_ladder.py"]),  # #31, this round
    # round 6's root-safety and CLI-convention modules (#48 item 6)
    # (the in-process unit tests only: the CLI suites reach every line through children, each run a minute)
    "conventions": ("gpudoctor/conventions.py", ["tests/core/test_conventions_units.py"]),
    "files/inputs": ("gpudoctor/files/inputs.py", ["tests/core/test_inputs_units.py"]),
    "files/safe": ("gpudoctor/files/safe.py", ["tests/files/test_safe_fds.py", "tests/core/test_safe_units.py",
                                               "tests/files/test_trust.py",
                                               "tests/hostile/test_out_links.py",
                                               "tests/hostile/test_shm_links.py", "tests/model/test_model_stage.py"]),
    "files/trust": ("gpudoctor/files/trust.py", ["tests/files/test_trust_units.py", "tests/files/test_trust.py",
                                                 "tests/hostile/test_one_door.py",
                                                 "tests/hostile/test_root_exec.py", "tests/hostile/test_root_config.py",
                                                 "tests/hostile/test_restage_source.py"]),
    "host/childpy": ("gpudoctor/host/childpy.py", ["tests/core/test_childpy_units.py", "tests/core/test_early_probe.py",
                                                   "tests/hostile/test_root_exec.py"]),
}

SWAP_CMP = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
            ast.GtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
            ast.Mod: ast.FloorDiv, ast.BitOr: ast.BitAnd, ast.BitAnd: ast.BitOr}
SYM = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
       ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
       ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.BitOr: "|", ast.BitAnd: "&", ast.And: "and", ast.Or: "or"}
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}  # their first argument: an event name


@dataclass
class Mutant:
    index: int  # the node's position in ast.walk order
    kind: str
    arg: int  # which operator of a comparison
    line: int
    end_line: int
    stmt_line: int
    what: str
    at_import: bool = False  # runs when the module is imported (module or class level, defaults, decorators)
    result: str = ""  # killed | survived | timeout | error
    tests: int = 0
    seconds: float = 0.0

    def key(self) -> tuple:
        return (self.index, self.kind, self.arg, self.what)


@dataclass
class Report:
    module: str
    source: str
    mutants: list[Mutant] = field(default_factory=list)
    baseline_s: float = 0.0
    note: str = ""
    sha256: str = ""


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """Nodes never mutated: docstrings, annotations, f-string parts, `from __future__`, log event names."""
    skip: set[int] = set()

    def all_of(node):
        skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                all_of(body[0])
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            all_of(node.returns)
        elif isinstance(node, ast.arg) and node.annotation:
            all_of(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            all_of(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            all_of(node)
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            all_of(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOG_METHODS \
                and node.args and isinstance(node.args[0], ast.Constant):
            skip.add(id(node.args[0]))
    return skip


def _stmt_lines(tree: ast.Module) -> dict[int, tuple[int, bool]]:
    """id(node) -> (the first line of its innermost statement, whether it runs at import: outside every function
    body). Which test reaches an import-time line is not known (each process imports the module once)."""
    out: dict[int, tuple[int, bool]] = {}

    def visit(node, stmt_line, at_import):
        if isinstance(node, ast.stmt):
            stmt_line = node.lineno
        out[id(node)] = (stmt_line, at_import)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            body = node.body if isinstance(node.body, list) else [node.body]
            for child in ast.iter_child_nodes(node):
                visit(child, stmt_line, at_import and not any(child is b for b in body))
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, stmt_line, at_import)

    visit(tree, 0, True)
    return out


def mutants_of(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    skip, stmt = _skipped_nodes(tree), _stmt_lines(tree)
    out: list[Mutant] = []

    def add(i, node, kind, what, arg=0):
        line, at_import = stmt[id(node)]
        out.append(Mutant(i, kind, arg, node.lineno, node.end_lineno or node.lineno, line, what, at_import))

    for i, node in enumerate(ast.walk(tree)):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for j, op in enumerate(node.ops):
                if type(op) in SWAP_CMP:
                    add(i, node, "cmp", f"{SYM[type(op)]} → {SYM[SWAP_CMP[type(op)]]}", j)
        elif isinstance(node, ast.BoolOp):
            add(i, node, "boolop", f"{SYM[type(node.op)]} → {'or' if isinstance(node.op, ast.And) else 'and'}")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            add(i, node, "not", "`not` dropped")
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in SWAP_BIN:
            add(i, node, "binop", f"{SYM[type(node.op)]} → {SYM[SWAP_BIN[type(node.op)]]}")
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                add(i, node, "const", f"{v} → {not v}")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                add(i, node, "const", f"{v!r} → {v + 1!r}")
            elif isinstance(v, str) and v:
                add(i, node, "const", f"{_short(v)} → 'XX'+…+'XX'")
        elif isinstance(node, (ast.If, ast.While, ast.IfExp)) \
                and not isinstance(node.test, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
            add(i, node, "negate", "condition negated")
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            add(i, node, "drop", f"call dropped: {_short(ast.unparse(node.value), 50)}")
        elif isinstance(node, ast.Raise):
            add(i, node, "drop", "raise dropped")
        elif isinstance(node, ast.Return) and node.value is not None \
                and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            add(i, node, "return", "returns None")
        elif isinstance(node, ast.Break):
            add(i, node, "flow", "break → continue")
        elif isinstance(node, ast.Continue):
            add(i, node, "flow", "continue → break")
    return out


def _short(text: str, n: int = 30) -> str:
    text = repr(text) if not text.startswith(("'", '"')) and "(" not in text else text
    return text if len(text) <= n else text[: n - 1] + "…"


def apply(source: str, m: Mutant) -> str:
    tree = ast.parse(source)
    node = list(ast.walk(tree))[m.index]
    if m.kind == "cmp":
        node.ops[m.arg] = SWAP_CMP[type(node.ops[m.arg])]()
    elif m.kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif m.kind == "not":
        _replace(tree, node, node.operand)
    elif m.kind == "binop":
        node.op = SWAP_BIN[type(node.op)]()
    elif m.kind == "const":
        v = node.value
        node.value = (not v) if isinstance(v, bool) else (v + 1 if isinstance(v, (int, float)) else f"XX{v}XX")
    elif m.kind == "negate":
        node.test = ast.UnaryOp(ast.Not(), node.test)
    elif m.kind == "drop":
        _replace(tree, node, ast.Pass())
    elif m.kind == "return":
        node.value = None
    elif m.kind == "flow":
        _replace(tree, node, ast.Continue() if isinstance(node, ast.Break) else ast.Break())
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _replace(tree, old, new) -> None:
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, name, new)
                return
            if isinstance(value, list) and any(v is old for v in value):
                value[[i for i, v in enumerate(value) if v is old][0]] = new
                return
    raise AssertionError("node not found")


# The line tracer: a module in the worker's site-packages that a .pth there imports, so the test process and every
# child python (`python -I` included: -I drops PYTHON* variables and the user site, not site-packages' .pth files)
# load it at start. Not a sitecustomize: Debian's python3 has its own in the standard library, which is found first. Its settings are a
# file beside it (a child started with child_env() keeps none of our variables); the test id is GPUDOCTOR_MUT_TEST or,
# in a child that lost it, the file the plugin rewrites before each test. It appends "test-id<TAB>line" once per pair,
# at once (a live check leaves through os._exit).
TRACER = '''
import json, os, sys, threading
try:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpudoctor_mutation_trace.json")) as _fh:
        _cfg = json.load(_fh)
except (OSError, ValueError):
    _cfg = {}
_target, _out = _cfg.get("target"), _cfg.get("trace")
if _target and _out:
    _seen = set()
    _test = os.environ.get("GPUDOCTOR_MUT_TEST")
    if _test is None:
        try:
            with open(_cfg["test_file"]) as _fh:
                _test = _fh.read()
        except OSError:
            _test = ""

    def _local(frame, event, arg):
        if event == "line":
            key = (os.environ.get("GPUDOCTOR_MUT_TEST", _test), frame.f_lineno)
            if key not in _seen:
                _seen.add(key)
                fd = os.open(_out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                os.write(fd, ("%s\\t%d\\n" % key).encode())
                os.close(fd)
        return _local

    def _global(frame, event, arg):
        return _local if frame.f_code.co_filename == _target else None

    sys.settrace(_global)
    threading.settrace(_global)
'''

PLUGIN = '''
import json
import os
import pytest

_CFG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpudoctor_mutation_trace.json")


def _tell(nodeid):
    try:
        with open(_CFG) as fh:
            path = json.load(fh).get("test_file")
    except (OSError, ValueError):
        return
    if path:
        with open(path, "w") as fh:
            fh.write(nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    os.environ["GPUDOCTOR_MUT_TEST"] = item.nodeid
    _tell(item.nodeid)
    yield
    os.environ["GPUDOCTOR_MUT_TEST"] = ""
    _tell("")
'''


class Worker:
    """One installed-layout copy of gpudoctor in a venv of its own: wN/venv, its site-packages holding gpudoctor (with
    checks/ and remedies/ in it) and a .pth naming the test interpreter's site-packages for the dependencies. Its
    python runs the tests, so every child started as sys.executable, `python -I` too, imports the mutant (a copy on
    PYTHONPATH is invisible to -I children: round 6's tracer reported their lines as unreached)."""

    def __init__(self, base: Path, n: int, python: str):
        venv = base / f"w{n}" / "venv"
        subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        self.python = str(venv / "bin" / "python")
        paths = json.loads(subprocess.run([python, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"],
                                          check=True, capture_output=True, text=True).stdout)
        site_dir = subprocess.run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip()
        self.site = Path(site_dir)
        for src, dst in LAYOUT.items():
            shutil.copytree(ROOT / src, self.site / dst, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # after this venv's own site-packages: the real install's gpudoctor (or its editable finder, a .pth of that
        # directory that is not processed from here) comes after the copy
        (self.site / "gpudoctor-mutation-deps.pth").write_text("".join(p + "\n" for p in paths))
        (self.site / "gpudoctor_mutation_trace.py").write_text(TRACER)
        (self.site / "gpudoctor-mutation-trace.pth").write_text("import gpudoctor_mutation_trace\n")
        (self.site / "gpudoctor_mutation_plugin.py").write_text(PLUGIN)
        self.cfg = self.site / "gpudoctor_mutation_trace.json"
        self.stamp = time.time()
        # the tests' working directory: an empty one of this worker's, never the checkout (a mutant that loses a
        # directory fd writes relative to the cwd: model/stage.py's lock and record landed in the checkout)
        self.cwd = base / f"w{n}" / "cwd"
        self.cwd.mkdir()

    def installed(self, rel: str) -> Path:
        top, _, rest = rel.partition("/")
        return self.site / LAYOUT[top] / rest

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUDOCTOR_MUT_") and k != "PYTHONPATH"}
        env.update(PYTHONSAFEPATH="1", **extra)
        env.pop("CI", None)  # a missing real component skips here (its test cannot kill), never fails the baseline
        return env

    def write(self, rel: str, text: str) -> None:
        """Put a version of the module in place; its bytecode cache can never be taken for it."""
        path = self.installed(rel)
        path.write_text(text)
        self.stamp += 2
        os.utime(path, (self.stamp, self.stamp))
        for pyc in (path.parent / "__pycache__").glob(path.stem + ".*.pyc"):
            pyc.unlink(missing_ok=True)

    def pytest(self, tests: list[str], timeout: float, trace: Path | None = None, target: str = "") \
            -> tuple[int | None, float, str]:
        argv = [self.python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "gpudoctor_mutation_plugin",
                "-o", "addopts=", "--timeout", str(int(timeout) + 5),
                *(str(ROOT / t) for t in tests)]  # ROOT's pyproject.toml found from them: node ids relative to ROOT
        if trace:
            self.cfg.write_text(json.dumps({"target": target, "trace": str(trace),
                                            "test_file": str(trace) + ".test"}))
        t = time.perf_counter()
        try:
            with _LIVE_LOCK:
                if _STOP.is_set():
                    raise Stopped()
                p = subprocess.Popen(argv, cwd=self.cwd, env=self.env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
                _LIVE.add(p)
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                _kill_group(p)  # the whole run: its children too
                p.communicate()
                return None, time.perf_counter() - t, str(exc)
            finally:
                with _LIVE_LOCK:
                    _LIVE.discard(p)
            if _STOP.is_set():
                raise Stopped()  # killed by the interrupt: not a verdict on the mutant
            return p.returncode, time.perf_counter() - t, out[-3000:] + err[-2000:]
        finally:
            if trace:
                self.cfg.unlink(missing_ok=True)
                Path(str(trace) + ".test").unlink(missing_ok=True)
            for left in self.cwd.iterdir():  # what a mutant wrote into its cwd: gone before the next one
                shutil.rmtree(left) if left.is_dir() and not left.is_symlink() else left.unlink()


def run_module(name: str, workers: list[Worker], trust_coverage: bool, say, retry: dict | None = None) -> Report:
    rel, tests = MODULES[name]
    src_path = ROOT / rel
    rep = Report(name, rel)
    tests = [t for t in tests if (ROOT / t.split("::")[0]).exists()]
    if not src_path.exists() or not tests:
        rep.note = f"not here yet ({rel} or its tests are missing)"
        return rep
    source = src_path.read_text()
    tree = ast.parse(source)
    if ast.dump(ast.parse(ast.unparse(tree))) != ast.dump(tree):
        rep.note = "its syntax tree does not unparse to the same code: not mutated"
        return rep
    rep.mutants = mutants_of(source)
    rep.sha256 = hashlib.sha256(source.encode()).hexdigest()
    earlier = {}  # a --retry of an earlier run of the same source: its kills stand, the rest run again
    if retry and retry.get("sha256") in (None, rep.sha256):
        earlier = {(m["index"], m["kind"], m["arg"], m["what"]): (m["result"], m["tests"], m["seconds"])
                   for m in retry["mutants"]
                   if m["result"] in ("killed", "timeout")}
    w0 = workers[0]
    target = str(w0.installed(rel))
    w0.write(rel, source)
    trace = Path(tempfile.mkstemp(prefix="gpudoctor-mut-trace-")[1])
    try:
        rc, secs, out = w0.pytest(tests, 1800, trace=trace, target=target)
        reached: dict[int, set[str]] = {}
        for ln in trace.read_text().splitlines():
            test, _, line = ln.rpartition("\t")
            reached.setdefault(int(line), set()).add(test)
    finally:
        trace.unlink(missing_ok=True)
    rep.baseline_s = secs
    if rc != 0:
        rep.note = f"its tests fail unmutated (rc {rc}): not mutated\n{out}"
        rep.mutants = []
        return rep
    say(f"{name}: {len(rep.mutants)} mutants; its tests pass unmutated in {secs:.1f} s; "
        f"{len(reached)} of its lines reached by a test")
    limit = max(30.0, 3 * secs)
    done: list[Mutant] = []

    def one(job):
        k, m = job
        w = workers[k % len(workers)]
        if m.key() in earlier:
            m.result, m.tests, m.seconds = earlier[m.key()]
            done.append(m)
            return m
        chosen = sorted({t for line in range(m.line, m.end_line + 1) for t in reached.get(line, ())}
                        | reached.get(m.stmt_line, set()))
        chosen = [] if m.at_import else [t for t in chosen if t]  # "": import time, not a test
        if not chosen and trust_coverage and not m.at_import:
            # no test reaches it (children included): not run. A line that runs at import is reached by every
            # process that imports the module, which the tracer cannot attribute: such a mutant always runs.
            m.result, m.tests = "unreached", 0
            done.append(m)
            return m
        w.write(rel, apply(source, m))
        rc, m.seconds, _ = w.pytest(chosen or tests, limit)
        m.tests = len(chosen)
        m.result = "timeout" if rc is None else "survived" if rc == 0 else "killed" if rc in (1, 2, 3) else "error"
        w.write(rel, source)
        done.append(m)
        say(f"  [{len(done)}/{len(rep.mutants)}] {m.result:8} {rel}:{m.line}: {m.what} ({m.tests or 'all'} tests, "
            f"{m.seconds:.1f} s)")
        return m

    busy = {}
    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        # one job queue per worker: a worker's tree is never written by two jobs at once
        for k in range(len(workers)):
            busy[k] = pool.submit(lambda k=k: [one((k, m)) for i, m in enumerate(rep.mutants)
                                               if i % len(workers) == k])
        for f in busy.values():
            f.result()
    return rep


def summary(rep: Report, source_lines: list[str]) -> list[str]:
    if not rep.mutants:
        return [f"{rep.module:24} {rep.note.splitlines()[0] if rep.note else 'no mutants'}"]
    n = len(rep.mutants)
    dead = sum(m.result in ("killed", "timeout") for m in rep.mutants)
    lost = [m for m in rep.mutants if m.result not in ("killed", "timeout")]
    out = [f"{rep.module:24} {dead:4}/{n:<4} killed  {100 * dead / n:5.1f} %   ({rep.source}; "
           f"{sum(m.result == 'timeout' for m in rep.mutants)} by timeout; baseline {rep.baseline_s:.1f} s)"]
    for m in lost:
        text = source_lines[m.line - 1].strip() if m.line <= len(source_lines) else ""
        reach = f"{m.tests} test(s) reach it" if m.tests else "no test was seen reaching it: all of them ran"
        out.append(f"    {m.result:8} {rep.source}:{m.line}: {m.what}   [{reach}]   | {_short(text, 70)}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("modules", nargs="*", help=f"modules to mutate (default all): {', '.join(MODULES)}")
    ap.add_argument("--jobs", type=int, default=1, help="mutants run at once (each in its own copy); default 1")
    ap.add_argument("--python", default=sys.executable, help="the interpreter the tests run with (default this one)")
    ap.add_argument("--trust-coverage", action="store_true",
                    help="do not run a mutant no test reaches (children included): counted 'unreached', not killed "
                         "(a line that runs at import always runs)")
    ap.add_argument("--json", metavar="FILE", help="also write every mutant and its result as JSON")
    ap.add_argument("--retry", metavar="FILE", help="an earlier --json of the same sources: its killed mutants "
                                                   "stand, only the others run again (after new tests)")
    ap.add_argument("--list", action="store_true", help="list the modules, their tests and mutant counts; run nothing")
    a = ap.parse_args(argv)
    names = a.modules or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown or a.jobs < 1:
        print(f"mutation.py: unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)}" if unknown
              else "mutation.py: --jobs must be >= 1", file=sys.stderr)
        return 3
    if a.list:
        for n in names:
            rel, tests = MODULES[n]
            here = (ROOT / rel).exists()
            count = len(mutants_of((ROOT / rel).read_text())) if here else 0
            print(f"{n:24} {rel:40} {count:4} mutants  tests: {' '.join(tests)}{'' if here else '  (not here yet)'}")
        return 0
    retries = {r["module"]: r for r in json.loads(Path(a.retry).read_text())} if a.retry else {}
    def on_signal(signum, _frame):
        stop_all()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)  # a kill still removes the worker trees (finally)
    signal.signal(signal.SIGINT, on_signal)
    base = Path(tempfile.mkdtemp(prefix="gpudoctor-mutation-"))
    reports = []
    t0 = time.perf_counter()
    try:
        workers = [Worker(base, k, a.python) for k in range(a.jobs)]
        # what a `python -I` child of the tests imports (tests/childenv.py, host/childpy.py): the mutated tree
        probe = subprocess.run([workers[0].python, "-I", "-c", "import gpudoctor.remedies as r; print(r.__file__)"],
                               cwd=ROOT, env=workers[0].env(), capture_output=True, text=True)
        if not probe.stdout.strip().startswith(str(workers[0].site)):
            got = probe.stdout.strip() or probe.stderr
            print(f"mutation.py: the mutated tree is not what {a.python} imports ({got})",
                  file=sys.stderr)
            return 2
        for n in names:
            rep = run_module(n, workers, a.trust_coverage, lambda s: print(s, file=sys.stderr, flush=True),
                             retry=retries.get(n))
            reports.append(rep)
            lines = (ROOT / rep.source).read_text().splitlines() if (ROOT / rep.source).exists() else []
            print("\n".join(summary(rep, lines)), flush=True)
    except Stopped:
        return 130
    finally:
        stop_all()
        shutil.rmtree(base, ignore_errors=True)
    print(f"# {sum(len(r.mutants) for r in reports)} mutants in {time.perf_counter() - t0:.0f} s, "
          f"{a.jobs} at once, tests run by {a.python}")
    if a.json:
        Path(a.json).write_text(json.dumps([{"module": r.module, "source": r.source, "sha256": r.sha256,
                                             "baseline_s": r.baseline_s, "note": r.note,
                                             "mutants": [{**m.__dict__, "key": m.key()} for m in r.mutants]}
                                            for r in reports], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
