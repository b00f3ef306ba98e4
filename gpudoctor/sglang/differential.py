"""The differential corpus: load it, lay its model configs on disk, run our rules, and key the cached SGLang verdicts.

Shared by tools/sglang_differential.py (which asks SGLang itself) and tests/sglang/test_differential.py (which holds
our rules to the cached verdicts). A case is {name, model, draft, device, args, env, options}; "{model}" and "{draft}"
in args become the directories its configs were written to.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from gpudoctor.errors import InputError
from gpudoctor.sglang.argparser import human_readable_int

CORPORA = ("corpus.yaml", "differential.yaml")
DEFAULT_DEVICE = "h200"


def load(corpus_dir: Path) -> tuple[dict, list[dict]]:
    """Models and cases of every corpus file (names must be unique)."""
    models: dict = {}
    cases: list[dict] = []
    for name in CORPORA:
        doc = yaml.safe_load((corpus_dir / name).read_text())
        models.update(doc.get("models") or {})
        cases += doc.get("cases") or []
    names = [c["name"] for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate case names: {sorted(dup)}")
    return models, cases


def write_models(models: dict, root: Path) -> dict[str, str]:
    dirs = {}
    for name, cfg in models.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
        dirs[name] = str(d)
    return dirs


def case_key(case: dict, models: dict) -> str:
    """A digest of everything that decides SGLang's verdict: args, env, device, and the configs used."""
    blob = {k: case.get(k) for k in ("args", "env", "device", "model", "draft")}
    blob["configs"] = {m: models.get(m) for m in (case.get("model"), case.get("draft")) if m}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def argv_of(case: dict, dirs: dict[str, str], strip: bool = False) -> list[str]:
    """The case's argv; strip=True drops a leading `python -m sglang.launch_server` as validate() does."""
    from gpudoctor.sglang.validate import strip_launcher

    sub = {"{model}": dirs.get(case.get("model"), ""), "{draft}": dirs.get(case.get("draft"), "")}
    argv = [sub.get(str(x), str(x)) for x in case["args"]]
    return strip_launcher(argv) if strip else argv


def options_of(case: dict) -> dict:
    """validate() keyword arguments from the case's `options` (CLI spelling) and device."""
    o: dict = {"gpu": case.get("device") or DEFAULT_DEVICE}
    it = iter(str(x) for x in case.get("options") or [])
    for k in it:
        v = next(it)
        if k == "--input-len":
            o["input_len"] = human_readable_int(v)
        elif k == "--output-len":
            o["output_len"] = human_readable_int(v)
        elif k == "--gpu-mem-gib":
            o["gpu_mem_gib"] = float(v)
            o["gpu"] = None
        elif k == "--fork-algorithms":
            o["fork_algorithms"] = v.split(",")
        elif k == "--gpu":
            o["gpu"] = v
    return o


def run_ours(case: dict, dirs: dict[str, str]):
    """Our verdict for a case (a ValidationResult), or the InputError it raised."""
    from gpudoctor.sglang.validate import validate

    try:
        return validate(argv_of(case, dirs), dirs.get(case.get("model")), dirs.get(case.get("draft")),
                        env=dict(case.get("env") or {}), **options_of(case))
    except InputError as exc:
        return exc


# Values SGLang derives from the GPU: not compared when a case gives our side another memory size (--gpu-mem-gib).
GPU_DERIVED = ("mem_fraction_static", "chunked_prefill_size")


def skipped_values(case: dict) -> tuple[str, ...]:
    return GPU_DERIVED if "--gpu-mem-gib" in [str(x) for x in case.get("options") or []] else ()


def comparable(case: dict) -> bool:
    """Fork-only flags: upstream SGLang rejects them by design, so the case says nothing about our rules."""
    return "--fork-algorithms" not in [str(x) for x in case.get("options") or []]
