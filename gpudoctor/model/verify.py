"""`model verify` as a library call: the header-level verification of probe.py plus location, marker and hashes."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from gpudoctor.errors import InputError
from gpudoctor.model import probe


def verify(path: str, *, revision: str = "main", hashes: bool = False, jobs: int = 4, on_bytes=None,
           on_hash_total=None) -> dict:
    """Verify a model directory or HF cache repo on this machine. Raises InputError for a path that is not one.

    The report is probe.verify_model's, plus "mount", "boot_id", "marker_boot": this|other|None and, with
    hashes=True, "hashed": [{file, algo, expected, actual, ok}] (mismatches are also problems: hash_mismatch).
    """
    rep = probe.verify_model(path, revision)
    rep["record"], rep["record_path"] = probe.read_record(path)
    rep["boot_id"] = probe.boot_id()
    rec = rep["record"]
    if rep["kind"] == "not_found" and rec:  # gone, but gpudoctor staged it here: wiped, not a typo
        boot = "this boot" if rec.get("boot_id") == rep["boot_id"] else "an earlier boot"
        rep["problems"].append({"kind": "wiped", "file": None, "expected": rec.get("total_bytes"), "actual": None,
                                "detail": f"the directory is gone; staged here from {rec.get('source')} in {boot} "
                                          f"(record {rep['record_path']})"})
    elif rep["bad_input"]:
        raise InputError(rep["bad_input"], path=path)
    mounts = probe.parse_mounts(probe.read_text("/proc/mounts") or "")
    rep["mount"] = probe.mount_of(os.path.realpath(rep["dir"] or probe.nearest_existing(path)), mounts)
    probe.fill_expected(rep, rec)
    marker = rep.get("marker")
    rep["marker_boot"] = None if not marker else ("this" if marker.get("boot_id") == rep["boot_id"] else "other")
    if hashes:
        targets = probe.hash_targets(rep)
        if not targets:
            raise InputError("--hash: nothing to compare against (not a Hugging Face cache, and no staging marker "
                             "with sha256 entries)", path=path)
        if on_hash_total:
            on_hash_total(sum(t["size"] for t in targets))
        with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="hash") as pool:
            digests = list(pool.map(lambda t: _digest(t, on_bytes), targets))
        rep["hashed"] = []
        for t, d in zip(targets, digests):
            ok = d == t["expected"]
            rep["hashed"].append({"file": t["file"], "algo": t["algo"], "expected": t["expected"], "actual": d,
                                  "ok": ok})
            if not ok:
                rep["problems"].append({"kind": "hash_mismatch", "file": t["file"], "expected": t["expected"],
                                        "actual": d, "detail": f"{t['algo']} of the content differs from its name"
                                        if rep["kind"] == "hf_repo" else f"sha256 differs from {probe.MARKER_NAME}"})
        rep["complete"] = not rep["problems"]
    return rep


def _digest(target: dict, on_bytes) -> str:
    try:
        return probe.hash_file(target, on_bytes)
    except OSError as exc:
        return f"unreadable: {exc.strerror}"
