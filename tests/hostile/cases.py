"""The hostile corpus: every input kind gpudoctor reads, each bad in the ways issue #17 lists (and more).

A Case is one real CLI run: argv (placeholders below), the exit code it must give, and what must stay true
(no traceback, no hang, no raw control byte on the terminal, one line of error, nothing half-written).

    {C}      tests/hostile/corpus (data files, read-only)
    {T}      the run's own empty directory (its cwd and HOME)
    {OK}     a healthy H200 snapshot (tests/fixtures/snapshots/h200-healthy.json)
    {DEV}    a /proc/devices capture (tests/fixtures/proxmox/proc-devices-uvm511.txt)
    {MADE}   the file or directory the case's `make` built in {T} (see test_corpus.MAKERS)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"


@dataclass
class Case:
    id: str
    argv: list[str]
    rc: int | tuple[int, ...] = 3
    make: str | None = None  # a generated input (test_corpus.MAKERS)
    err: str | None = None  # a fragment the error line must contain
    one_line_on: str = "stderr"  # where a bad-input run prints its single line (NPD: stdout)
    setup: dict = field(default_factory=dict)  # relative path in {T} -> text written before the run
    classes: tuple[str, ...] = ()  # the classes this case covers


# where the error must point: an unclosed bracket or quote at the line it was opened, not where the parser noticed
LINES = {"syntax-unclosed-bracket.yaml": "syntax-unclosed-bracket.yaml:4: YAML syntax error",
         "syntax-unclosed-quote.yaml": "syntax-unclosed-quote.yaml:4: YAML syntax error",
         "merge-key.yaml": "merge keys (<<) are not supported", "custom-tag.yaml": "is not plain data",
         "python-tag.yaml": "is not plain data", "billion-laughs.yaml": "aliases",
         "nan-stall.yaml": "got nan", "inf-ready.yaml": "got inf", "not-utf8.yaml": "not UTF-8"}


def _files(kind: str, suffix: str) -> list[Path]:
    return sorted((CORPUS / kind).glob(f"*{suffix}"))


def inventory_cases() -> list[Case]:
    out = []
    for p in _files("inventory", ".yaml"):
        f = f"{{C}}/inventory/{p.name}"
        err = LINES.get(p.name, p.name)
        out += [Case(f"inventory-show-{p.stem}", ["inventory", "show", "--inventory", f], err=err),
                Case(f"inventory-fleet-{p.stem}", ["check", "--all", "--inventory", f], err=err),
                Case(f"inventory-gate-{p.stem}", ["gate", "--inventory", f, "--snapshot", "{OK}"], err=err)]
    return out


def campaign_cases() -> list[Case]:
    out = []
    for p in _files("campaign", ".yaml"):
        if p.stem == "valid-local":
            continue
        out.append(Case(f"campaign-{p.stem}", ["bench", "run", f"{{C}}/campaign/{p.name}", "--out", "{T}/out"],
                        err=LINES.get(p.name, p.name)))
    return out


def snapshot_cases() -> list[Case]:
    files = [f"{{C}}/snapshot/{p.name}" for p in _files("snapshot", ".json")]
    made = {"snapshot-fifo": "fifo", "snapshot-directory": "dir", "snapshot-deep-json": "deep-json",
            "snapshot-huge-schema-value": "huge-schema-json"}
    out = []
    targets = [(Path(f).stem, f, None) for f in files] + [(k, "{MADE}", v) for k, v in made.items()]
    targets.append(("char-device", "/dev/zero", None))
    for stem, f, mk in targets:
        out += [
            Case(f"snapshot-check-{stem}", ["check", "--snapshot", f], make=mk),
            Case(f"snapshot-gate-{stem}", ["gate", "--snapshot", f], make=mk),
            Case(f"snapshot-gate-json-{stem}", ["gate", "--json", "--snapshot", f], make=mk),
            Case(f"snapshot-gate-npd-{stem}", ["gate", "--npd", "--snapshot", f], rc=2, make=mk, one_line_on="stdout"),
            Case(f"snapshot-gate-slurm-{stem}", ["gate", "--slurm", "--node", "n1", "--snapshot", f], make=mk,
                 rc=(2, 3)),
            Case(f"snapshot-fix-{stem}", ["fix", "--facts", f], make=mk),
        ]
    # judged, healthy — but its host name is hostile: exit 0, and not one raw escape on the terminal
    out += [Case("snapshot-escape-host-check", ["check", "--snapshot", "{MADE}"], rc=0, make="escape-host"),
            Case("snapshot-escape-host-check-all", ["check", "-a", "--snapshot", "{MADE}"], rc=0, make="escape-host"),
            Case("snapshot-escape-host-gate", ["gate", "--snapshot", "{MADE}"], rc=0, make="escape-host"),
            Case("snapshot-escape-fail-check", ["check", "--snapshot", "{MADE}"], rc=2, make="escape-fail"),
            Case("snapshot-escape-fail-gate", ["gate", "--snapshot", "{MADE}"], rc=2, make="escape-fail"),
            Case("snapshot-escape-fail-fix", ["fix", "--facts", "{MADE}"], rc=(1, 2), make="escape-fail")]
    return out


def results_cases() -> list[Case]:
    out = []
    for p in _files("results", ".jsonl"):
        out.append(Case(f"results-{p.stem}", ["bench", "report", "--no-plots", "{T}/run"],
                        setup={"run/results.jsonl": p.read_bytes()}, err="results.jsonl"))
    out.append(Case("results-deep-json", ["bench", "report", "--no-plots", "{T}/run"],
                    setup={"run/results.jsonl": b"[" * 100_000 + b"]" * 100_000 + b"\n"}, err="results.jsonl:1"))
    out.append(Case("results-fifo", ["bench", "report", "--no-plots", "{T}/run"], make="fifo-results"))
    return out


def proxmox_cases() -> list[Case]:
    return [
        Case("proxmox-escape-in-line", ["lxc", "audit", "--config", "{C}/proxmox/escape-in-line.conf", "--devices",
                                        "{DEV}"], rc=(0, 1, 2)),
        Case("proxmox-not-utf8", ["lxc", "audit", "--config", "{C}/proxmox/not-utf8.conf", "--devices", "{DEV}"],
             rc=(0, 1, 2, 3)),
        Case("proxmox-fifo-config", ["lxc", "audit", "--config", "{MADE}", "--devices", "{DEV}"], make="fifo"),
        Case("proxmox-fifo-devices", ["lxc", "audit", "--config", "{C}/proxmox/escape-in-line.conf", "--devices",
                                      "{MADE}"], make="fifo"),
        Case("proxmox-fix-fifo-config", ["lxc", "fix", "--config", "{MADE}", "--devices", "{DEV}"], make="fifo"),
        Case("proxmox-huge-line", ["lxc", "audit", "--config", "{MADE}", "--devices", "{DEV}"], make="huge-conf",
             rc=(0, 1, 2, 3)),
    ]


def model_cases() -> list[Case]:
    return [
        Case("model-overlapping-offsets", ["model", "verify", "{MADE}"], rc=2, make="st-overlap"),
        Case("model-float-offsets", ["model", "verify", "{MADE}"], rc=2, make="st-float"),
        Case("model-offsets-hole", ["model", "verify", "{MADE}"], rc=2, make="st-hole"),
        Case("model-deep-header", ["model", "verify", "{MADE}"], rc=2, make="st-deep"),
        Case("model-zero-heads", ["sglang", "validate", "--model-config", "{MADE}", "--", "--model-path", "x"],
             make="cfg-zero-heads", err="num_attention_heads must be an integer >= 1"),
        Case("model-config-fifo", ["sglang", "validate", "--model-config", "{MADE}", "--", "--model-path", "x"],
             make="fifo"),
        Case("model-gate-snapshot-ignores-model", ["gate", "--snapshot", "{OK}", "--model", "/nonexistent/model"],
             err="cannot be combined with --snapshot"),
    ]


def sglang_cases() -> list[Case]:
    v = ["sglang", "validate", "--"]
    return [
        Case("sglang-tp-size-0", [*v, "--model-path", "x", "--tp-size", "0"], rc=2),
        Case("sglang-context-length-negative", [*v, "--model-path", "x", "--context-length", "-1"], rc=2),
        Case("sglang-mem-fraction-nan", [*v, "--model-path", "x", "--mem-fraction-static", "nan"], rc=2),
        Case("sglang-pp-size-0", [*v, "--model-path", "x", "--pp-size", "0"], rc=2),
        Case("sglang-escape-in-flag", [*v, "--model-path", "x", "--\x1b[2Jbogus-flag", "1"], rc=2),
    ]


def flag_cases() -> list[Case]:
    load = ["bench", "load", "--max-tokens", "8", "--out", "{T}/o"]
    return [
        Case("flag-timeout-nan", ["check", "--snapshot", "{OK}", "--timeout", "nan"]),
        Case("flag-timeout-inf", ["check", "--snapshot", "{OK}", "--timeout", "inf"]),
        Case("flag-timeout-negative", ["check", "--snapshot", "{OK}", "--timeout", "-1"]),
        Case("flag-gate-timeout-nan", ["gate", "--snapshot", "{OK}", "--timeout", "nan"]),
        Case("flag-fix-timeout-inf", ["fix", "--facts", "{OK}", "--timeout", "inf"]),
        Case("flag-daemon-interval-inf", ["daemon", "--interval", "inf"]),
        Case("flag-server-url-ftp", [*load, "--server-url", "ftp://127.0.0.1:21/"]),
        Case("flag-server-url-file", [*load, "--server-url", "file:///etc/passwd"]),
        Case("flag-server-url-no-host", [*load, "--server-url", "http://"]),
        Case("flag-stall-timeout-negative", [*load, "--server-url", "http://127.0.0.1:9", "--stall-timeout", "-5"]),
        Case("flag-ready-timeout-inf", [*load, "--server-url", "http://127.0.0.1:9", "--ready-timeout", "inf"]),
        Case("flag-sglang-url-javascript", ["check", "--sglang-url", "javascript:alert(1)"]),
        Case("flag-gate-sglang-url-ftp", ["gate", "--sglang-url", "ftp://127.0.0.1/"]),
        Case("flag-prom-missing-dir", ["check", "--snapshot", "{OK}", "--prom", "{T}/no/such/dir/g.prom"],
             err="does not exist"),
        Case("flag-prom-is-directory", ["check", "--snapshot", "{OK}", "--prom", "{T}"]),
        Case("flag-snapshot-out-missing-dir", ["snapshot", "-o", "{T}/no/such/dir/s.json"], err="does not exist"),
        Case("flag-bench-load-out-is-file", [*load[:-1], "{T}/a-file", "--server-url", "http://127.0.0.1:9"],
             setup={"a-file": b"not a directory\n"}, err="not a directory"),
        Case("flag-bench-run-out-is-file", ["bench", "run", "{C}/campaign/valid-local.yaml", "--out", "{T}/a-file"],
             setup={"a-file": b"not a directory\n"}, err="not a directory"),
        Case("flag-huge-value", ["check", "--explain", "x" * 20000], err="more characters"),
        Case("flag-escape-in-host", ["check", "--host", "ct\x1b[2J\x1b]0;owned\x07", "--inventory",
                                     "{C}/good-inventory.yaml"], rc=3),
        # a host gpudoctor cannot reach: the gate, in every mode, is closed with the reason (exit 3; NPD: 2)
        Case("host-gate-unreachable", ["gate", "--host", "ct200", "--inventory", "{C}/unreachable-inventory.yaml"],
             one_line_on="stdout", err="could not check"),
        Case("host-gate-json-unreachable", ["gate", "--json", "--host", "ct200", "--inventory",
                                            "{C}/unreachable-inventory.yaml"], one_line_on="json"),
        Case("host-gate-npd-unreachable", ["gate", "--npd", "--host", "ct200", "--inventory",
                                           "{C}/unreachable-inventory.yaml"], rc=2, one_line_on="stdout"),
        Case("host-check-unreachable", ["check", "--host", "ct200", "--inventory", "{C}/unreachable-inventory.yaml"],
             err="ct200"),
        Case("refused-run-leaves-no-lock", ["bench", "run", "{C}/campaign/valid-local.yaml", "--out", "{T}/out"],
             setup={"out/results.jsonl": b""}, err="--resume"),
    ]


def all_cases() -> list[Case]:
    return [*inventory_cases(), *campaign_cases(), *snapshot_cases(), *results_cases(), *proxmox_cases(),
            *model_cases(), *sglang_cases(), *flag_cases()]
