"""Campaign files: methods x TP x workloads x concurrency, validated with FILE:LINE errors, expanded to configurations.

The schema is documented in docs/bench.md; examples/campaign.yaml is a complete example. Validation refuses unknown
keys (a typo must not silently drop a setting) and checks every value's type and range before anything starts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.campaign.heal import HealSpec
from gpudoctor.bench.server.remote import DEFAULT_REMOTE_DIR
from gpudoctor.files import yamlload

DEFAULT_SERVER = "python3 -m sglang.launch_server"  # SGLang's own docs; Debian and Ubuntu have no bare `python`
DEFAULT_SERVERS = {"sglang": DEFAULT_SERVER, "vllm": "vllm serve"}
KINDS = ("sglang", "vllm")  # how a server is launched (flags) and which log knowledge applies
DEFAULT_GATE = "gpudoctor gate --profile benchmark"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")  # as the inventory's host names
TOP_KEYS = {"name", "target", "model", "tokenizer_dir", "server", "nccl_env", "tp", "methods", "workloads",
            "request_rates", "arrival", "max_error_rate", "slo",
            "concurrency", "context_limit", "timeouts", "warmup", "gate", "gpu", "on_crash", "validate", "heal",
            "suspect", "health", "cache", "slurm"}
MAX_CONTEXT_TOKENS = 2 * 1024 * 1024  # more than any served model; longer prompts take minutes just to build
GPU_REQUESTS = ("gpus", "gres", "none")  # slurm.gpu_request
_TIME = re.compile(r"^(?:\d+-)?\d+(?::\d+){0,2}$|^(?:UNLIMITED|INFINITE)$")  # sbatch --time
_TOKEN = re.compile(r"^\S+$")
TIMEOUTS = {"ready_s": 1800.0, "stall_s": 120.0, "level_s": 7200.0, "stop_s": 60.0, "gpu_release_s": 300.0,
            "gate_s": 600.0}


@dataclass
class Method:
    name: str
    args: list[str]
    draft_model: str | None = None
    baseline: bool = False
    tp: list[int] | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Workload:
    name: str
    prompts: str
    max_tokens: list[int]
    context_lengths: list[int | None]
    num_prompts: int | None
    trials: int
    turns: int | None = None  # agentic multi-turn: turns per session (gpudoctor.bench.client.multiturn)
    think_s: float = 0.0
    conversations: str | None = None  # a JSONL of conversations; None: the built-in set
    trace: str | None = None  # trace replay: a Mooncake-format JSONL (gpudoctor.bench.client.trace)
    time_scale: float = 1.0
    block_tokens: int = 512


@dataclass
class Health:
    """`health:` — sampling the serving GPUs during each level (gpudoctor.bench.cell.health)."""

    sample: bool = True
    interval_s: float = 0.5
    gpus: list[int] | None = None
    kernel_log: str | None = "/dev/kmsg"


@dataclass
class SlurmSpec:
    """A campaign's `slurm:` section (docs/bench.md "Campaigns on Slurm"): how gpudoctor.campaign.slurm submits."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None  # sbatch --time
    gpu_request: str = "gpus"  # gpus: --gpus=TP; gres: --gres=gpu:TP; none: no GPU request
    sbatch_args: list[str] = field(default_factory=list)
    max_jobs: int = 0  # configurations at once (0: all)
    exclusive: bool = True  # one configuration per node: a benchmark shares no node, and servers share no port
    node_retries: int = 2  # resubmissions of one configuration after nodes refused by the gate
    poll_s: float = 5.0


@dataclass(frozen=True)
class GateCall:
    """A campaign gate that is gpudoctor's own `gate` command: judged in this process (gpudoctor.gate.gate_target
    through gpudoctor.target), never by running gpudoctor's CLI. None of these given: the campaign's defaults."""

    profile: str | None = None
    models: tuple[str, ...] = ()  # --model; none: the configuration's model and draft
    expect_gpus: int | None = None
    sglang_url: str | None = None
    timeout: float = 10.0
    host: str | None = None  # --host; none: the campaign's target
    inventory: str | None = None  # --inventory; none: the campaign's inventory


# `gpudoctor gate` flags a campaign's gate may carry to be judged in process; any other flag (--json, --slurm,
# --snapshot, ...) makes it an ordinary command, run as written.
_GATE_FLAGS = {"--profile": "profile", "--model": "models", "--expect-gpus": "expect_gpus",
               "--sglang-url": "sglang_url", "--timeout": "timeout", "--host": "host", "--inventory": "inventory"}


def gpudoctor_argv(argv: list[str]) -> list[str] | None:
    """The arguments after `gpudoctor` for `gpudoctor ARGS` (by bare name) or `PYTHON -m gpudoctor ARGS`; else None.
    A path to some gpudoctor executable is the user's own command."""
    if argv[:1] == ["gpudoctor"]:
        return argv[1:]
    if len(argv) >= 3 and argv[1:3] == ["-m", "gpudoctor"] and "python" in Path(argv[0]).name:
        return argv[3:]
    return None


def _gate_call(v: _V, argv: list[str] | None) -> GateCall | None:
    """The gate command as a GateCall when it is gpudoctor's own gate with only the flags above; its values are
    checked here, at the file's line."""
    rest = gpudoctor_argv(argv or [])
    if not rest or rest[0] != "gate":
        return None
    kw: dict = {"models": []}
    args = iter(rest[1:])
    for a in args:
        flag, eq, val = a.partition("=")
        if flag not in _GATE_FLAGS:
            return None
        if not eq:
            val = next(args, None)
            if val is None:
                v.fail(f"gate.command: {flag} needs a value", "gate", "command")
        key = _GATE_FLAGS[flag]
        if key == "models":
            kw["models"].append(val)
        elif key in ("expect_gpus", "timeout"):
            try:
                num = int(val) if key == "expect_gpus" else float(val)
            except ValueError:
                v.fail(f"gate.command: {flag} must be a {'whole ' if key == 'expect_gpus' else ''}number, got "
                       f"{val!r}", "gate", "command")
            from gpudoctor.files.inputs import number

            kw[key] = number(num, f"gate.command {flag}", integer=key == "expect_gpus",
                             lo=0 if key == "expect_gpus" else 0.1, hi=None if key == "expect_gpus" else 600,
                             error=lambda msg, **_kw: v.doc.error(msg, "gate", "command"))
        else:
            kw[key] = val
    if kw.get("sglang_url") is not None:
        from gpudoctor.files.inputs import http_url

        http_url(kw["sglang_url"], "gate.command --sglang-url",
                 error=lambda msg, **_kw: v.doc.error(msg, "gate", "command"))
    kw["models"] = tuple(kw["models"])
    return GateCall(**kw)


@dataclass
class Config:
    """One server configuration: a method at a TP size, and how to launch it."""

    method: Method
    tp: int
    argv: list[str]
    env: dict[str, str]
    n_command: int = 0  # argv[:n_command] is the server command, the rest are SGLang flags

    @property
    def sglang_args(self) -> list[str]:
        return self.argv[self.n_command:]

    @property
    def label(self) -> str:
        return f"{self.method.name}-tp{self.tp}"


@dataclass
class Campaign:
    path: str
    name: str
    target: str  # "local", or an inventory host the servers are started on over SSH
    target_line: int | None
    model: str
    tokenizer_dir: str
    server_command: list[str]
    host: str
    port: int
    client_host: str
    server_args: list[str]
    server_env: dict[str, str]
    remote_dir: str
    client_host_given: bool
    nccl_env: dict[int, dict[str, str]]
    tp: list[int]
    methods: list[Method]
    workloads: list[Workload]
    concurrency: list[int]
    context_limit: int | None
    timeouts: dict[str, float]
    warmup: int
    gate_command: list[str] | None
    gate_call: GateCall | None  # the gate command when it is gpudoctor's own gate (judged in process)
    heal_command: list[str] | None
    gpu_release_mib: int
    on_crash: str
    validate: bool
    heal: object = None  # gpudoctor.campaign.heal.HealSpec when the campaign has a `heal:` section
    kind: str = "sglang"
    api: str = "native"
    request_rates: list[float] = field(default_factory=list)
    arrival: str = "poisson"
    max_error_rate: float = 0.0
    slo_ttft_ms: float | None = None
    slo_itl_ms: float | None = None
    suspect: dict = field(default_factory=dict)  # gpudoctor.bench.cell.suspect thresholds (defaults filled in)
    health: Health = field(default_factory=Health)
    cache: str = "flush"  # before each level: flush the prefix cache, or keep it
    slurm: SlurmSpec | None = None  # the campaign's `slurm:` section (bench run --slurm), None without one
    lines: dict = field(default_factory=dict, repr=False)  # (key, ...) -> line in the file, for later errors
    text: str = field(default="", repr=False)  # the file as it was read and parsed (a BOM dropped)

    @property
    def sha256(self) -> str:
        """The campaign's content hash: of the text that was parsed, not of the file read again. `--resume` proves
        with it that an output directory holds this campaign (DIR/campaign.yaml is that text); records carry it."""
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def real_path(self) -> str:
        """The file's one canonical name (absolute, links resolved): what records carry and a Slurm job is given,
        however the path was typed."""
        return os.path.realpath(self.path)

    @property
    def is_remote(self) -> bool:
        return self.target != "local"

    @property
    def base_url(self) -> str:
        return f"http://{self.client_host}:{self.port}"

    @property
    def baseline(self) -> str | None:
        return next((m.name for m in self.methods if m.baseline), None)

    def configs(self) -> list[Config]:
        """Every (method, tp) in run order: by TP, baseline first, then methods in file order."""
        out = []
        order = sorted(self.methods, key=lambda m: not m.baseline)
        for tp in self.tp:
            for m in order:
                if m.tp is not None and tp not in m.tp:
                    continue
                if self.kind == "vllm":
                    argv = [*self.server_command, self.model, "--tensor-parallel-size", str(tp), "--host", self.host,
                            "--port", str(self.port), *self.server_args, *_vllm_draft(m.args, m.draft_model)]
                else:
                    argv = [*self.server_command, "--model-path", self.model, "--tp-size", str(tp), "--host",
                            self.host, "--port", str(self.port), *self.server_args, *m.args]
                    if m.draft_model:
                        argv += ["--speculative-draft-model-path", m.draft_model]
                env = {**self.server_env, **self.nccl_env.get(tp, {}), **m.env}
                out.append(Config(m, tp, argv, env, len(self.server_command)))
        return out


def _vllm_draft(args: list[str], draft: str | None) -> list[str]:
    """vLLM takes the draft model inside --speculative-config's JSON: set its "model" (adding the flag if needed)."""
    import json

    if not draft:
        return list(args)
    out = list(args)
    for i, a in enumerate(out):
        if a == "--speculative-config" and i + 1 < len(out):
            conf = json.loads(out[i + 1])
            out[i + 1] = json.dumps({**conf, "model": draft})
            return out
        if a.startswith("--speculative-config="):
            out[i] = "--speculative-config=" + json.dumps({**json.loads(a.split("=", 1)[1]), "model": draft})
            return out
    return out + ["--speculative-config", json.dumps({"model": draft})]


class _V:
    """Validation helpers bound to one located document."""

    def __init__(self, doc: yamlload.Located):
        self.doc = doc

    def fail(self, msg: str, *where):
        raise self.doc.error(msg, *where)

    def mapping(self, value, *where, keys: set[str] | None = None) -> dict:
        if not isinstance(value, dict):
            self.fail(f"{_name(where)} must be a mapping", *where)
        for k in value:
            if keys is not None and k not in keys:
                self.fail(f"unknown key {k!r} in {_name(where)} (allowed: {', '.join(sorted(keys))})", *where, k)
        return value

    def string(self, value, *where, required: bool = True) -> str | None:
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            self.fail(f"{_name(where)} must be a non-empty string", *where)
        return value

    def number(self, value, *where, integer: bool = False, lo: float = 0, hi: float | None = None) -> float | int:
        """A finite number (NaN and inf refused) in [lo, hi], or the error at its line."""
        from gpudoctor.files.inputs import number

        return number(value, _name(where), lo=lo, hi=hi, integer=integer,
                      error=lambda msg, **_kw: self.doc.error(msg, *where))

    def int_list(self, value, *where, lo: int = 1) -> list[int]:
        items = value if isinstance(value, list) else [value]
        if not items:
            self.fail(f"{_name(where)} must not be empty", *where)
        where_i = (lambda i: (*where, i)) if isinstance(value, list) else (lambda i: where)
        out = [int(self.number(v, *where_i(i), integer=True, lo=lo)) for i, v in enumerate(items)]
        if len(set(out)) != len(out):
            self.fail(f"{_name(where)} has duplicates: {out}", *where)
        return out

    def argv(self, value, *where) -> list[str]:
        if value is None:
            return []
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                self.fail(f"{_name(where)}: cannot split into arguments: {exc}", *where)
        if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                           for v in value):
            return [str(v) for v in value]
        self.fail(f"{_name(where)} must be a string or a list of strings", *where)

    def env(self, value, *where) -> dict[str, str]:
        if value is None:
            return {}
        self.mapping(value, *where)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                self.fail(f"{_name(where)}: {k!r} is not an environment variable name", *where, k)
            if isinstance(v, (dict, list)) or v is None:
                self.fail(f"{_name(where)}.{k} must be a scalar", *where, k)
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out


def _name(where: tuple) -> str:
    return ".".join(str(w) for w in where) or "the campaign"


def load(path: str) -> Campaign:
    """Read and validate a campaign file; any problem raises ConfigError naming FILE:LINE."""
    from gpudoctor.errors import ConfigError

    # it names the servers root starts: as root, root's by the one rule, judged on the fd read (#40, #47)
    doc, _text = yamlload.load_file(path, what="campaign", error=ConfigError, obeyed=True)  # _text: Campaign.text
    v = _V(doc)
    d = v.mapping(doc.data, keys=TOP_KEYS)
    base = Path(path).resolve().parent
    for req in ("model", "methods", "tp", "workloads"):
        if req not in d:
            v.fail(f"missing required key {req!r}")
    if "concurrency" not in d and "request_rates" not in d:
        v.fail("missing required key 'concurrency' (closed-loop levels) or 'request_rates' (open-loop levels)")
    target = v.string(d.get("target", "local"), "target")
    if target == "localhost":
        target = "local"
    if not HOST_NAME.match(target):
        v.fail(f"target {target!r} must be local or the name of an inventory host", "target")
    model = v.string(d["model"], "model")
    tp = v.int_list(d["tp"], "tp")
    server = v.mapping(d.get("server") or {}, "server",
                       keys={"command", "host", "port", "client_host", "args", "env", "remote_dir", "kind", "api"})
    kind = server.get("kind", "sglang")
    if kind not in KINDS:
        v.fail(f"server.kind must be one of {', '.join(KINDS)}, got {kind!r}", "server", "kind")
    api = server.get("api", "native" if kind == "sglang" else "completions")
    if api not in ("native", "completions", "chat") or (kind == "vllm" and api == "native"):
        allowed = "completions or chat" if kind == "vllm" else "native, completions or chat"
        v.fail(f"server.api must be {allowed} for a {kind} server, got {api!r}", "server", "api")
    command = v.argv(server.get("command", DEFAULT_SERVERS[kind]), "server", "command")
    if not command:
        v.fail("server.command must not be empty", "server", "command")
    host = v.string(server.get("host", "127.0.0.1"), "server", "host")
    port = int(v.number(server.get("port", 30000 if kind == "sglang" else 8000), "server", "port", integer=True,
                        lo=1, hi=65535))
    methods = _methods(v, d["methods"], tp)
    nccl = {}
    for k, env in v.mapping(d.get("nccl_env") or {}, "nccl_env").items():
        if not isinstance(k, int) or k not in tp:
            v.fail(f"nccl_env key {k!r} must be one of the tp sizes {tp}", "nccl_env", k)
        nccl[k] = v.env(env, "nccl_env", k)
    timeouts = dict(TIMEOUTS)
    for k, val in v.mapping(d.get("timeouts") or {}, "timeouts", keys=set(TIMEOUTS)).items():
        timeouts[k] = float(v.number(val, "timeouts", k, lo=0.001))
    raw_gate = d.get("gate")
    if raw_gate is not False and raw_gate is not None and not isinstance(raw_gate, dict):
        v.fail(f"gate must be a mapping (command, heal_command) or false, got {raw_gate!r}", "gate")
    # `gate: false` is `gate: {command: false}`: no gate (#41: it was read as an empty mapping, the default gate ran)
    gate = {"command": False} if raw_gate is False else v.mapping(raw_gate or {}, "gate",
                                                                   keys={"command", "heal_command"})
    gate_cmd = gate.get("command", DEFAULT_GATE)
    gate_argv = None if gate_cmd in (None, False) else v.argv(gate_cmd, "gate", "command") or None
    gpu = v.mapping(d.get("gpu") or {}, "gpu", keys={"release_mib"})
    on_crash = d.get("on_crash", "skip")
    if on_crash not in ("skip", "restart"):
        v.fail(f"on_crash must be skip or restart, got {on_crash!r}", "on_crash")
    validate = d.get("validate", "auto")
    if validate not in ("auto", True, False):
        v.fail(f"validate must be auto, true or false, got {validate!r}", "validate")
    if validate == "auto":  # SGLang's own launcher: check its flags; a stand-in or other server: do not
        validate = any("sglang" in part for part in command)
    limit = d.get("context_limit")
    limit = None if limit is None else int(v.number(limit, "context_limit", integer=True, lo=1,
                                                    hi=MAX_CONTEXT_TOKENS))
    rates = []
    for i, r in enumerate(d.get("request_rates") or []):
        rates.append(float(v.number(r, "request_rates", i, lo=0.001)))
    arrival = d.get("arrival", "poisson")
    if arrival not in ("poisson", "constant"):
        v.fail(f"arrival must be poisson or constant, got {arrival!r}", "arrival")
    slo = v.mapping(d.get("slo") or {}, "slo", keys={"ttft_ms", "itl_ms"})
    heal = _heal(v, d["heal"]) if d.get("heal") not in (None, False) else None
    from gpudoctor.bench.cell import suspect as suspectlib
    suspect = suspectlib.check(d.get("suspect"), v.fail)
    hraw = v.mapping(d.get("health") or {}, "health", keys={"sample", "interval_s", "gpus", "kernel_log"})
    if not isinstance(hraw.get("sample", True), bool):
        v.fail("health.sample must be true or false", "health", "sample")
    kl = hraw.get("kernel_log", "/dev/kmsg")
    health = Health(sample=hraw.get("sample", True),
                    interval_s=float(v.number(hraw.get("interval_s", 0.5), "health", "interval_s", lo=0.05, hi=0.5)),
                    gpus=v.int_list(hraw["gpus"], "health", "gpus", lo=0) if "gpus" in hraw else None,
                    kernel_log=None if kl in (None, False) else v.string(kl, "health", "kernel_log"))
    if health.kernel_log and not Path(health.kernel_log).is_absolute():
        health.kernel_log = str(base / health.kernel_log)
    cache = d.get("cache", "flush")
    if cache not in ("flush", "keep"):
        v.fail(f"cache must be flush or keep, got {cache!r}", "cache")
    return Campaign(
        path=path, name=v.string(d.get("name", Path(path).stem), "name"), target=target,
        target_line=doc.line("target") if "target" in d else None, model=model,
        tokenizer_dir=v.string(d.get("tokenizer_dir", model), "tokenizer_dir"), server_command=command, host=host,
        port=port, client_host=v.string(server.get("client_host", host), "server", "client_host"),
        server_args=v.argv(server.get("args"), "server", "args"), server_env=v.env(server.get("env"), "server", "env"),
        remote_dir=v.string(server.get("remote_dir", DEFAULT_REMOTE_DIR), "server", "remote_dir"),
        client_host_given="client_host" in server,
        nccl_env=nccl, tp=tp, methods=methods, workloads=_workloads(v, d["workloads"], base, limit),
        concurrency=sorted(v.int_list(d["concurrency"], "concurrency")) if "concurrency" in d else [],
        context_limit=limit,
        timeouts=timeouts, warmup=int(v.number(d.get("warmup", 2), "warmup", integer=True, lo=0)),
        gate_command=gate_argv, gate_call=_gate_call(v, gate_argv),
        heal_command=v.argv(gate.get("heal_command"), "gate", "heal_command") or None,
        gpu_release_mib=int(v.number(gpu.get("release_mib", 1024), "gpu", "release_mib", integer=True, lo=0)),
        on_crash=on_crash, validate=validate, heal=heal, kind=kind, api=api, request_rates=sorted(set(rates)),
        arrival=arrival, max_error_rate=float(v.number(d.get("max_error_rate", 0.0), "max_error_rate", lo=0, hi=1)),
        slo_ttft_ms=None if "ttft_ms" not in slo else float(v.number(slo["ttft_ms"], "slo", "ttft_ms", lo=0.001)),
        slo_itl_ms=None if "itl_ms" not in slo else float(v.number(slo["itl_ms"], "slo", "itl_ms", lo=0.001)),
        suspect=suspect, health=health, cache=cache,
        slurm=parse_slurm(v, d["slurm"]) if d.get("slurm") not in (None, False) else None,
        lines=doc.lines, text=_text,
    )


def parse_slurm(v: _V, raw) -> SlurmSpec:
    """`slurm:` — how `bench run --slurm` submits each configuration (gpudoctor.campaign.slurm), checked at
    its lines."""
    keys = {"partition", "account", "qos", "time_limit", "gpu_request", "sbatch_args", "max_jobs", "exclusive",
            "node_retries", "poll_s"}
    d = v.mapping(raw, "slurm", keys=keys)
    s = SlurmSpec()
    for k in ("partition", "account", "qos", "time_limit"):
        if d.get(k) is not None:
            val = str(d[k])
            if not _TOKEN.match(val):
                v.fail(f"slurm.{k} must be one word, got {val!r}", "slurm", k)
            setattr(s, k, val)
    if s.time_limit and not _TIME.match(s.time_limit):
        v.fail(f"slurm.time_limit must be sbatch's --time (MINUTES, H:MM:SS, D-HH:MM:SS), got {s.time_limit!r}",
               "slurm", "time_limit")
    s.gpu_request = d.get("gpu_request", "gpus")
    if s.gpu_request not in GPU_REQUESTS:
        v.fail(f"slurm.gpu_request must be one of {', '.join(GPU_REQUESTS)}, got {s.gpu_request!r}",
               "slurm", "gpu_request")
    s.sbatch_args = v.argv(d.get("sbatch_args"), "slurm", "sbatch_args")
    for i, a in enumerate(s.sbatch_args):
        if not a.startswith("-") or not _TOKEN.match(a):
            v.fail(f"slurm.sbatch_args: {a!r} must be one option (--name=value, no spaces)", "slurm", "sbatch_args")
        if a.split("=")[0] in ("--job-name", "-J", "--comment", "--output", "-o", "--exclude", "-x", "--chdir"):
            v.fail(f"slurm.sbatch_args: {a.split('=')[0]} is set by gpudoctor (docs/bench.md)", "slurm",
                   "sbatch_args")
    s.max_jobs = int(v.number(d.get("max_jobs", 0), "slurm", "max_jobs", integer=True, lo=0))
    s.node_retries = int(v.number(d.get("node_retries", 2), "slurm", "node_retries", integer=True, lo=0, hi=100))
    s.poll_s = float(v.number(d.get("poll_s", 5.0), "slurm", "poll_s", lo=0.1, hi=600))
    if not isinstance(d.get("exclusive", True), bool):
        v.fail("slurm.exclusive must be true or false", "slurm", "exclusive")
    s.exclusive = d.get("exclusive", True)
    return s


def _heal(v: _V, raw):
    """`heal:` — judge the target after a crash or a loss and heal what `allow` names (docs/bench.md)."""
    h = v.mapping({} if raw is True else raw, "heal", keys={"allow", "wait_s", "rounds", "profile"})
    allow = h.get("allow") or []
    if isinstance(allow, str):
        allow = [allow]
    if not isinstance(allow, list) or not all(isinstance(a, str) and a.strip() for a in allow):
        v.fail("heal.allow must be a list of remedy ids or patterns (e.g. [model.stage, lxc.cgroup_allow, "
               "lxc.cgroup_allow.reboot])", "heal", "allow")
    return HealSpec(allow=tuple(allow), wait_s=float(v.number(h.get("wait_s", 300), "heal", "wait_s", lo=1)),
                    rounds=int(v.number(h.get("rounds", 3), "heal", "rounds", integer=True, lo=1, hi=20)),
                    profile=v.string(h.get("profile", "benchmark"), "heal", "profile"))


def check_paths(camp: Campaign, host) -> None:
    """Before anything starts: every path the servers will be given (model, draft models) exists on the host they
    run on. A value that is not path-like (no leading /, ./, ../) may be a Hugging Face repo id and is left alone."""
    from gpudoctor.errors import ConfigError

    want = [(camp.model, "model", ("model",))]
    want += [(m.draft_model, f"draft model of method {m.name}", ("methods", m.name, "draft_model"))
             for m in camp.methods if m.draft_model]
    want = [w for w in want if w[0].startswith(("/", "./", "../"))]
    if not want:
        return
    found = host.stat_many([w[0] for w in want])
    for path, what, where in want:
        st = found.get(path)
        if st is None or not st.exists:
            err = getattr(st, "error", None) or "ENOENT"
            line = next((camp.lines[where[:i]] for i in range(len(where), 0, -1) if where[:i] in camp.lines), None)
            raise ConfigError(f"{what} {path!r} does not exist on {camp.target} ({err}): no server is started",
                              path=camp.path, line=line)


def check_gate_profile(camp: Campaign, inventory) -> None:
    """Before anything starts: the profile of an in-process gate exists in the inventory it will be judged with (or
    is built in); an unknown one is the campaign's bad input at its gate line, not a stop before the first server."""
    from gpudoctor.errors import ConfigError
    from gpudoctor.gate import resolve_profile
    from gpudoctor.target import resolve_inventory

    call = camp.gate_call
    if call is None:
        return
    inv = resolve_inventory(call.inventory or inventory, required=False)
    try:
        resolve_profile(call.profile, dict(inv.profiles) if inv is not None else {})
    except ConfigError as exc:
        where = f"; inventory: {inv.path}" if inv is not None else ""
        raise ConfigError(f"gate.command: {exc.message}{where}", path=camp.path,
                          line=camp.lines.get(("gate", "command"))) from None


def _methods(v: _V, raw, tp: list[int]) -> list[Method]:
    v.mapping(raw, "methods")
    if not raw:
        v.fail("methods must name at least one method", "methods")
    out = []
    for name, m in raw.items():
        where = ("methods", name)
        if not isinstance(name, str) or not NAME.match(name):
            v.fail(f"method name {name!r} must be letters, digits, '.', '_' or '-'", *where)
        m = v.mapping(m if m is not None else {}, *where, keys={"args", "draft_model", "baseline", "tp", "env"})
        baseline = m.get("baseline", False)
        if not isinstance(baseline, bool):
            v.fail(f"methods.{name}.baseline must be true or false", *where, "baseline")
        mtp = v.int_list(m["tp"], *where, "tp") if "tp" in m else None
        for i, t in enumerate(mtp or []):
            if t not in tp:
                v.fail(f"methods.{name}.tp: {t} is not in the campaign's tp list {tp}", *where, "tp", i)
        out.append(Method(name, v.argv(m.get("args"), *where, "args"),
                          v.string(m.get("draft_model"), *where, "draft_model", required=False), baseline, mtp,
                          v.env(m.get("env"), *where, "env")))
    marked = [m for m in out if m.baseline]
    if len(marked) > 1:
        v.fail(f"only one method can be the baseline; marked: {', '.join(m.name for m in marked)}", "methods")
    if not marked:
        for m in out:
            if m.name in ("baseline", "autoregressive"):
                m.baseline = True
                break
    return out


def _workloads(v: _V, raw, base: Path, limit: int | None) -> list[Workload]:
    if not isinstance(raw, list) or not raw:
        v.fail("workloads must be a non-empty list", "workloads")
    out, names = [], set()
    for i, w in enumerate(raw):
        where = ("workloads", i)
        w = v.mapping(w, *where, keys={"name", "prompts", "max_tokens", "context_lengths", "num_prompts", "trials",
                                       "turns", "think_ms", "conversations", "trace", "time_scale", "block_tokens"})
        name = v.string(w.get("name"), *where, "name")
        if not NAME.match(name) or name in names:
            v.fail(f"workload name {name!r} must be unique and made of letters, digits, '.', '_' or '-'",
                   *where, "name")
        names.add(name)
        prompts = v.string(w.get("prompts", "builtin"), *where, "prompts")
        if prompts != "builtin":
            p = Path(prompts) if Path(prompts).is_absolute() else base / prompts
            if not p.is_file():
                v.fail(f"prompt set {prompts!r} not found (looked for {p})", *where, "prompts")
            prompts = str(p)
        extra = _agentic(v, w, where, base, name)
        if "trace" in w:
            out.append(Workload(name, prompts, [0], [None], None,
                                int(v.number(w.get("trials", 1), *where, "trials", integer=True, lo=1)), **extra))
            continue
        if "max_tokens" not in w:
            v.fail(f"workload {name!r} needs max_tokens", *where)
        ctx_raw = w.get("context_lengths", [None])
        ctx_list = ctx_raw if isinstance(ctx_raw, list) else [ctx_raw]
        ctx = [None if c is None else int(v.number(c, *where, "context_lengths", j, integer=True, lo=1,
                                                   hi=MAX_CONTEXT_TOKENS))
               for j, c in enumerate(ctx_list)]
        for j, c in enumerate(ctx):
            if c is not None and limit is not None and c >= limit:
                v.fail(f"workload {name!r}: context length {c} does not fit the campaign's context_limit {limit}",
                       *where, "context_lengths", j)
        n = w.get("num_prompts")
        out.append(Workload(name, prompts, v.int_list(w["max_tokens"], *where, "max_tokens"), ctx or [None],
                            None if n is None else int(v.number(n, *where, "num_prompts", integer=True, lo=1)),
                            int(v.number(w.get("trials", 1), *where, "trials", integer=True, lo=1)), **extra))
    return out


def _agentic(v: _V, w: dict, where: tuple, base: Path, name: str) -> dict:
    """A workload's multi-turn (`turns`, `think_ms`, `conversations`) or trace (`trace`, `time_scale`,
    `block_tokens`) keys, checked; the trace and conversations files are read here, so a bad line stops the
    campaign before anything starts (FILE:LINE of that file)."""
    out: dict = {}
    if "turns" in w and "trace" in w:
        v.fail(f"workload {name!r}: turns (multi-turn sessions) and trace (replay) do not mix", *where, "trace")
    for k in ("think_ms", "conversations"):
        if k in w and "turns" not in w:
            v.fail(f"workload {name!r}: {k} needs turns", *where, k)
    for k in ("time_scale", "block_tokens"):
        if k in w and "trace" not in w:
            v.fail(f"workload {name!r}: {k} needs trace", *where, k)
    if "turns" in w:
        if "context_lengths" in w:
            v.fail(f"workload {name!r}: a multi-turn workload's context grows with its turns; no context_lengths",
                   *where, "context_lengths")
        out["turns"] = int(v.number(w["turns"], *where, "turns", integer=True, lo=1, hi=1000))
        out["think_s"] = float(v.number(w.get("think_ms", 0), *where, "think_ms", lo=0, hi=3_600_000)) / 1000.0
        if "conversations" in w:
            path = _file(v, w["conversations"], base, where, "conversations")
            from gpudoctor.bench.client.multiturn import load_conversations

            load_conversations(path, out["turns"])
            out["conversations"] = path
    if "trace" in w:
        if "max_tokens" in w or "context_lengths" in w:
            v.fail(f"workload {name!r}: a trace gives each request's input and output length; no max_tokens or "
                   "context_lengths", *where, "max_tokens" if "max_tokens" in w else "context_lengths")
        path = _file(v, w["trace"], base, where, "trace")
        from gpudoctor.bench.client.trace import load_trace

        entries = load_trace(path)
        if len(entries) < 2 or entries[-1].t_ms <= entries[0].t_ms:
            v.fail(f"workload {name!r}: the trace needs at least two requests at different times", *where, "trace")
        out["trace"] = path
        out["time_scale"] = float(v.number(w.get("time_scale", 1.0), *where, "time_scale", lo=1e-4, hi=1e4))
        out["block_tokens"] = int(v.number(w.get("block_tokens", 512), *where, "block_tokens", integer=True, lo=1,
                                           hi=1 << 20))
    return out


def _file(v: _V, value, base: Path, where: tuple, key: str) -> str:
    rel = v.string(value, *where, key)
    p = Path(rel) if Path(rel).is_absolute() else base / rel
    if not p.is_file():
        v.fail(f"{key} file {rel!r} not found (looked for {p})", *where, key)
    return str(p)
