"""`gpudoctor model verify|stage`: is the model in tmpfs whole, and put it there as fast as the disk allows."""

from __future__ import annotations

import datetime as _dt
import json
import sys

import click

from gpudoctor.errors import EXIT_FAIL, EXIT_OK, EXIT_WARN, InputError
from gpudoctor.model import human_bytes
from gpudoctor.options import Count


SCHEMA_VERIFY, SCHEMA_STAGE = "gpudoctor.model-verify/1", "gpudoctor.model-stage/1"


def _size(n) -> str:
    return "absent" if n is None else f"{human_bytes(n)} ({n} bytes)" if isinstance(n, int) else str(n)


def _when(ts) -> str:
    try:
        return _dt.datetime.fromtimestamp(float(ts)).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _progress(total: int, label: str):
    """A rich progress bar on a TTY (stderr), else None. Returns (progress, advance)."""
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    from gpudoctor.report import console, esc

    prog = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                    TransferSpeedColumn(), TimeRemainingColumn(), console=console(stderr=True), transient=False)
    task = prog.add_task(esc(label), total=total)
    return prog, (lambda n: prog.update(task, advance=n))


@click.group("model")
def model():
    """Verify and stage model weights (tmpfs, Hugging Face cache).

    \b
    Examples:
      gpudoctor model verify /dev/shm/Qwen3-32B
      gpudoctor model verify ~/.cache/huggingface/hub/models--Qwen--Qwen3-32B --hash
      gpudoctor model stage --from /data/models/Qwen3-32B --to /dev/shm/Qwen3-32B            (dry run)
      gpudoctor model stage --from /data/models/Qwen3-32B --to /dev/shm/Qwen3-32B --apply
    """


@model.command("verify")
@click.argument("path", type=click.Path(file_okay=True, dir_okay=True, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.option("--hash", "do_hash", is_flag=True,
              help="Also read every byte: HF blobs against their names (LFS sha256, git sha1), staged files against "
                   "the sha256 in the staging marker.")
@click.option("--revision", default="main", show_default=True, help="HF cache: the ref (or commit) to verify.")
@click.option("--jobs", type=Count(1, 256), default=4, show_default=True, help="Parallel hashes (--hash).")
def verify_cmd(path, as_json, do_hash, revision, jobs):
    """Tell a complete model from a skeleton, without reading tensor data.

    PATH is a model directory (config.json, model.safetensors.index.json, shards) or a Hugging Face cache repo
    folder (models--org--name). Checked: config.json; every shard the index names is present and whole by its own
    safetensors header (size == 8 + N + max data_offsets end); single-file model.safetensors; refs/main ->
    snapshots/<commit>; dangling symlinks; blobs/*.incomplete; a metadata-only snapshot; files listed in the
    staging marker written by `model stage`.

    \b
    Examples:
      gpudoctor model verify /dev/shm/Qwen3-32B
      gpudoctor model verify /data/hf/hub/models--Qwen--Qwen3-32B --hash
      gpudoctor model verify /dev/shm/Qwen3-32B --json | jq .problems

    \b
    Exit codes: 0 complete, 2 incomplete (each missing or truncated file named with expected vs actual size),
    3 bad input (PATH is not a model directory).
    """
    from gpudoctor.model.verify import verify

    holder = {}

    def on_total(total):
        if not as_json:
            holder["prog"], holder["adv"] = _progress(total, "hashing")
            if holder["prog"]:
                holder["prog"].start()

    try:
        rep = verify(path, revision=revision, hashes=do_hash, jobs=jobs,
                     on_bytes=lambda n: holder.get("adv") and holder["adv"](n), on_hash_total=on_total)
    finally:
        if holder.get("prog"):
            holder["prog"].stop()
    code = EXIT_OK if rep["complete"] else EXIT_FAIL
    if as_json:
        click.echo(json.dumps({"schema": SCHEMA_VERIFY, **rep}, indent=1, sort_keys=True))
        raise SystemExit(code)
    _render_verify(rep)
    raise SystemExit(code)


def _render_verify(rep: dict) -> None:
    where = ""
    if rep.get("mount"):
        m = rep["mount"]
        where = f"  ({m['fstype']} {m['mountpoint']})"
    kind = {"dir": "model directory", "hf_repo": "Hugging Face cache repo",
            "not_found": "directory MISSING"}.get(rep["kind"], rep["kind"])
    click.echo(f"{rep['path']}: {kind}{where}")
    if rep["kind"] == "hf_repo":
        click.echo(f"  revision  {rep['revision'] or '?'}  ->  {rep['dir'] or 'no snapshot'}")
    w = rep["weights"]
    if w["shards"]:
        via = f" via {w['index']}" if w["index"] else ""
        click.echo(f"  weights   {w['shards']} {w['format'] or ''} file(s){via}, {human_bytes(w['bytes'])}")
    marker, rec = rep.get("marker"), rep.get("record")
    if marker:
        boot = "this boot" if rep.get("marker_boot") == "this" else "an EARLIER boot (boot_id differs)"
        click.echo(f"  staged    {_when(marker.get('staged_at'))} from {marker.get('source')} in {boot}")
    elif rec:
        boot = "this boot" if rec.get("boot_id") == rep.get("boot_id") else "an earlier boot"
        click.echo(f"  record    {rec.get('state')} {_when(rec.get('at'))} from {rec.get('source')} in {boot}; "
                   f"no marker in the directory ({rep.get('record_path')})")
    if rep.get("hashed"):
        bad = sum(not h["ok"] for h in rep["hashed"])
        click.echo(f"  hashes    {len(rep['hashed']) - bad} of {len(rep['hashed'])} match")
    for n in rep["notes"]:
        click.echo(f"  note      {n}")
    if rep["complete"]:
        click.echo(f"COMPLETE: {len(rep['files'])} files, {human_bytes(rep['bytes'])} "
                   f"(checked in {rep['seconds'] * 1000:.1f} ms)")
        return
    click.echo(f"INCOMPLETE: {len(rep['problems'])} problem(s)")
    for p in rep["problems"]:
        line = f"  {p['kind']:<20} {p['file'] or ''}"
        if p["kind"] == "hash_mismatch":
            line += f"  expected {p['expected']}, actual {p['actual']}"
        elif p["expected"] is not None or p["actual"] is not None or p["kind"] in ("missing", "truncated"):
            line += f"  expected {_size(p['expected']) if p['expected'] is not None else '? (unknown)'}, " \
                    f"actual {_size(p['actual'])}"
        if p["detail"]:
            line += f"  — {p['detail']}"
        click.echo(line)


@model.command("stage")
@click.option("--from", "src", metavar="SRC", help="Model directory or HF cache repo folder on persistent storage.")
@click.option("--from-hub", "hub", metavar="REPO",
              help="Download REPO (org/name) into the HF cache with huggingface_hub first (needs network).")
@click.option("--to", "dst", metavar="DST", required=True, help="Target directory, normally under /dev/shm.")
@click.option("--apply", "do_apply", is_flag=True, help="Copy (default: dry run, nothing changes).")
@click.option("--jobs", type=Count(1, 256), default=None, help="Parallel copy threads [min(8, cores)].")
@click.option("--revision", default="main", show_default=True, help="HF cache: the ref (or commit) to stage.")
@click.option("--exclude", multiple=True, metavar="GLOB",
              help="Do not copy source files matching GLOB (relative name; repeatable), e.g. 'original/*'.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (and result) as JSON.")
def stage_cmd(src, hub, dst, do_apply, jobs, revision, exclude, as_json):
    """Copy a model from persistent storage into tmpfs, in parallel, safely.

    Dry run by default: shows what would be copied and the space needed. Refuses when DST's filesystem, the memory
    cgroup (tmpfs pages count against it) or MemAvailable lack room, when the source is itself incomplete, or when
    a process has files open or mapped under DST (say which pid). Shards are copied in parallel into
    .NAME.gpudoctor-part and renamed when whole; the index and config.json come last, then a header verification,
    then the marker DST/.gpudoctor-staged.json with this boot's boot_id. An interrupted stage never leaves DST
    looking complete; rerun it and whole shards are skipped.

    \b
    Examples:
      gpudoctor model stage --from /data/models/Qwen3-32B --to /dev/shm/Qwen3-32B
      gpudoctor model stage --from /data/hf/hub/models--Qwen--Qwen3-32B --to /dev/shm/Qwen3-32B --apply --jobs 16
      gpudoctor model stage --from-hub meta-llama/Llama-3.1-8B --to /dev/shm/llama --exclude 'original/*' --apply

    \b
    Exit codes, as `fix`: 0 staged and verified, or (dry run) nothing to copy; 1 (dry run) a copy is planned:
    add --apply; 2 refused or failed; 3 bad input.
    """
    from gpudoctor.model import stage as st

    if bool(src) == bool(hub):
        raise InputError("give exactly one of --from (a model directory) or --from-hub (a Hugging Face repo id)")
    if hub:
        src, revision = st.resolve_hub(hub, revision)
    plan = st.plan_stage(src, dst, revision=revision, exclude=tuple(exclude))
    # a dry run exits as `fix` does: 1 when it would change something, 0 when DST is already whole (docs/cli.md)
    dry_code = EXIT_WARN if any(f.action == "copy" for f in plan.files) or plan.stale else EXIT_OK
    if as_json and not do_apply:
        click.echo(json.dumps({"schema": SCHEMA_STAGE, "plan": plan.to_json()}, indent=1, sort_keys=True))
        raise SystemExit(EXIT_FAIL if plan.refusals else dry_code)
    if not as_json:
        _render_plan(plan, do_apply)
    if plan.refusals:
        for r in plan.refusals:
            click.echo(f"REFUSED: {r}", err=True)
        raise SystemExit(EXIT_FAIL)
    if not do_apply:
        click.echo("dry run: nothing changed. Add --apply to stage." if dry_code else
                   "dry run: nothing to copy, DST is already whole.")
        raise SystemExit(dry_code)
    prog, advance = (None, None) if as_json else _progress(plan.to_copy, "staging")
    try:
        if prog:
            prog.start()
        res = st.apply_stage(plan, jobs=jobs or st.DEFAULT_JOBS, on_progress=advance)
    finally:
        if prog:
            prog.stop()
    if as_json:
        click.echo(json.dumps({"schema": SCHEMA_STAGE, "plan": plan.to_json(), "result": res}, indent=1,
                              sort_keys=True))
        raise SystemExit(EXIT_OK)
    rate = f" at {human_bytes(res['rate_bps'])}/s" if res["copied_bytes"] and res["rate_bps"] else ""
    click.echo(f"STAGED: copied {human_bytes(res['copied_bytes'])} in {res['seconds']:.1f} s{rate} "
               f"({res['jobs']} jobs, {res['method']}); {res['skipped']} file(s) already whole; "
               f"verified {res['verify']['shards']} weight file(s); marker {res['marker']}")
    raise SystemExit(EXIT_OK)


def _render_plan(plan, do_apply: bool) -> None:
    where = f"{plan.mount['fstype']} {plan.mount['mountpoint']}" if plan.mount else "?"
    rev = f"@{plan.revision[:12]}" if plan.revision else ""
    click.echo(f"stage {plan.src}{rev} -> {plan.dst}  ({where})")
    copy = [f for f in plan.files if f.action == "copy"]
    skip = [f for f in plan.files if f.action == "skip"]
    click.echo(f"  copy      {len(copy)} file(s), {human_bytes(plan.to_copy)}; skip {len(skip)} already whole"
               + (f"; remove first {len(plan.stale)} stale" if plan.stale else ""))
    room = plan.room
    parts = [f"{plan.mount['mountpoint'] if plan.mount else plan.dst} avail {human_bytes(room.get('fs_avail'))}"]
    if "cgroup_headroom" in room and room["cgroup_headroom"] is not None:
        parts.append(f"memory cgroup headroom {human_bytes(room['cgroup_headroom'])}")
    if room.get("mem_available") is not None:
        parts.append(f"MemAvailable {human_bytes(room['mem_available'])}")
    click.echo(f"  room      needs {human_bytes(room['needed'])}: " + " · ".join(parts))
    shown = copy[:12] if do_apply else plan.files[:20]
    for f in shown:
        click.echo(f"    {f.action:<5} {f.name:<48} {human_bytes(f.size):>10}  {f.why}")
    more = (len(copy) if do_apply else len(plan.files)) - len(shown)
    if more > 0:
        click.echo(f"    ... {more} more")
    for n in plan.notes:
        click.echo(f"  note      {n}")
