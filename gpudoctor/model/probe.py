"""Model weights on disk and in tmpfs: layout checks, safetensors headers, mounts, cgroup, staging marker.

Standard library only: `gather/model.py` ships this file's source, with files/trust.py's text (the one door: every
file here is opened through it, so a FIFO planted as a marker or ref is one line, never a hang) inside it, to a
target host and runs it there as one program (``python3 -c SOURCE ARGS_JSON``), and `model verify` / `model stage`
import it locally.
Nothing here reads tensor data; a shard is judged by its own header (8-byte LE length N, N bytes of JSON,
then data: complete iff size == 8 + N + max(data_offsets end)).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import sys
import time

DOOR_IMPORT = "try:  # the one door"  # gather/model.py replaces this block with files/trust.py's text
try:  # the one door (files/trust.py); on a target gather/model.py sends its text inside this program's text
    from gpudoctor.files.trust import Refused, open_file, read_fd, refusal
except ImportError:  # pragma: no cover - the standalone program, where trust.py's text defines these names
    pass

SCHEMA = "gpudoctor.model/1"
MARKER_NAME = ".gpudoctor-staged.json"  # written last by `model stage`, inside DST
MARKER_SCHEMA = "gpudoctor.staged/1"
PART_SUFFIX = ".gpudoctor-part"  # a copy in progress: `.NAME.gpudoctor-part`, never looks like a shard
LOCK_NAME = ".gpudoctor-stage.lock"
STATE_SUBDIR = "staged"  # <state dir>/staged/<key>.json: the persistent record of each stage (survives reboots)
MAX_HEADER = 100 * 1024 * 1024  # the safetensors format caps the JSON header at 100 MB
HEAD_READ = 1 << 16
INDEX_SUFFIX = ".index.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
HF_PREFIXES = ("models--", "datasets--", "spaces--")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
_OWN_FILES = (MARKER_NAME, LOCK_NAME)
_MODEL_SIGNS = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def _errname(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno))


# --- safetensors -----------------------------------------------------------------------------------------------
class HeaderError(Exception):
    """A shard whose header cannot be trusted: kind is truncated | bad_header; expected may be None."""

    def __init__(self, kind: str, detail: str, expected: int | None = None):
        super().__init__(detail)
        self.kind, self.detail, self.expected = kind, detail, expected


def read_header(fd: int, size: int) -> tuple[int, bytes]:
    """The header length N and the raw N header bytes of an open safetensors file of `size` bytes."""
    if size < 8:
        raise HeaderError("truncated", f"{size} bytes: shorter than the 8-byte header length")
    head = os.pread(fd, HEAD_READ, 0)
    n = int.from_bytes(head[:8], "little")
    if n == 0 or n > MAX_HEADER:
        raise HeaderError("bad_header", f"header length {n} is not a safetensors header (0 < N <= 100 MB)")
    if 8 + n > size:
        raise HeaderError("truncated", f"header says {n} header bytes but the file has only {size} bytes", None)
    raw = head[8:8 + n]
    if len(raw) < n:
        raw += os.pread(fd, n - len(raw), 8 + len(raw))
    return n, raw


def parse_header(n: int, raw: bytes) -> tuple[int, list[str]]:
    """(expected file size, tensor names) from a raw header; HeaderError when it is not valid safetensors JSON."""
    try:
        hdr = json.loads(raw.rstrip(b" \x00"))
    except (ValueError, RecursionError) as exc:
        raise HeaderError("bad_header", f"header is not JSON ({exc.__class__.__name__}: {str(exc)[:60]})") from None
    if not isinstance(hdr, dict):
        raise HeaderError("bad_header", "header JSON is not an object")
    spans, names = [], []
    for name, info in hdr.items():
        if name == "__metadata__":
            continue
        shown = repr(name) if len(name) <= 60 else f"{name[:60]!r}… ({len(name)} characters)"
        offs = info.get("data_offsets") if isinstance(info, dict) else None
        # integers only: 1.5, "8" or true are not offsets (the safetensors crate rejects them; int() would not)
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in offs)):
            raise HeaderError("bad_header", f"tensor {shown} has no valid data_offsets (two integers)")
        b, e = offs
        if b < 0 or e < b:
            raise HeaderError("bad_header", f"tensor {shown} has data_offsets [{b}, {e}]")
        spans.append((b, e, shown))
        names.append(name)
    # Like the safetensors crate's validation: sorted by start, each tensor begins where the previous one ended
    # (no overlap, no hole), starting at 0; the data section is exactly as long as the last end.
    end = 0
    for b, e, shown in sorted(spans):
        if b != end:
            what = "overlaps the previous tensor" if b < end else f"leaves a hole of {b - end} bytes before it"
            raise HeaderError("bad_header", f"tensor {shown} at data_offsets [{b}, {e}] {what} (previous end {end})")
        end = e
    return 8 + n + end, names


def _open_model_file(path: str) -> int:
    """A model's file, through the door: a regular file by its fd (a FIFO or device swapped in is refused, never
    read), the user's own links followed (a cache links its blobs)."""
    return open_file(path, strict=False, any_link=True)[0]


def check_safetensors(path: str) -> dict:
    """{"size", "expected", "header_len", "tensors", "kind": ok|truncated|oversized|bad_header|<errno>, "detail"}."""
    out: dict = {"size": None, "expected": None, "tensors": [], "kind": "ok", "detail": ""}
    try:
        fd = _open_model_file(path)
    except OSError as exc:
        out.update(kind="unreadable", detail=f"open: {_refusal(exc)}")
        return out
    try:
        size = os.fstat(fd).st_size
        out["size"] = size
        n, raw = read_header(fd, size)
        out["header_len"] = n
        expected, names = parse_header(n, raw)
        out["expected"], out["tensors"] = expected, names
        if size < expected:
            out.update(kind="truncated", detail=f"{size} of {expected} bytes ({size * 100 // expected}%)")
        elif size > expected:
            out.update(kind="oversized", detail=f"{size} bytes, header accounts for {expected}")
    except HeaderError as exc:
        out.update(kind=exc.kind, detail=exc.detail, expected=exc.expected)
    except OSError as exc:
        out.update(kind="unreadable", detail=f"read: {_errname(exc)}")
    finally:
        os.close(fd)
    return out


def header_bytes(path: str) -> bytes | None:
    """The first 8 + N bytes of a safetensors file (to tell two revisions of one shard apart), or None."""
    try:
        fd = _open_model_file(path)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        n, raw = read_header(fd, size)
        return n.to_bytes(8, "little") + raw
    except (HeaderError, OSError):
        return None
    finally:
        os.close(fd)


# --- walking a model directory ---------------------------------------------------------------------------------
def is_hf_repo(path: str) -> bool:
    """A Hugging Face cache repo folder: models--org--name, or a folder holding snapshots/ with refs/ or blobs/."""
    if os.path.basename(os.path.normpath(path)).startswith(HF_PREFIXES):
        return True
    return os.path.isdir(os.path.join(path, "snapshots")) and (
        os.path.isdir(os.path.join(path, "refs")) or os.path.isdir(os.path.join(path, "blobs")))


def _hf_root_repos(path: str) -> list[str]:
    try:
        return sorted(e for e in os.listdir(path) if e.startswith(HF_PREFIXES))
    except OSError:
        return []


def _is_model_file(name: str) -> bool:
    return name in _MODEL_SIGNS or name.endswith(WEIGHT_SUFFIXES + (INDEX_SUFFIX,))


def _child_models(names: list[str]) -> list[str]:
    """The subdirectories that are models when the directory itself has no model file at its top (none of
    config.json, tokenizer files, weights or an index beside each other): [] for a model directory, including one
    with subfolders of its own (original/, a diffusers model's unet/ beside model_index.json)."""
    top = [n for n in names if "/" not in n]
    if any(_is_model_file(n) or n == "model_index.json" for n in top):
        return []
    return sorted({n.split("/", 1)[0] for n in names if n.count("/") == 1 and _is_model_file(n.split("/", 1)[1])})


def walk_files(root: str) -> tuple[dict, list, list]:
    """(files {rel: info}, dangling [{file, target}], partials [rel]) for a tree; dot-dirs (.git, .cache) skipped.

    info = {"size", "real" (symlinks resolved), "link" (the link text or None), "mode", "mtime_ns"}.
    """
    files: dict = {}
    dangling: list = []
    partials: list = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            it = os.scandir(os.path.join(root, rel_dir) if rel_dir else root)
        except OSError:
            continue
        with it:
            for e in it:
                rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
                if e.name.endswith(PART_SUFFIX):
                    partials.append(rel)
                    continue
                if e.name in _OWN_FILES and not rel_dir:
                    continue
                try:
                    if e.is_symlink():
                        link = os.readlink(e.path)
                        try:
                            st = os.stat(e.path)
                        except OSError:
                            dangling.append({"file": rel, "target": link})
                            continue
                        if stat.S_ISDIR(st.st_mode):
                            continue  # a linked directory is not followed (no loops)
                    else:
                        link = None
                        if e.is_dir(follow_symlinks=False):
                            if not e.name.startswith("."):
                                stack.append(rel)
                            continue
                        st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                files[rel] = {"size": st.st_size, "real": os.path.realpath(e.path) if link else e.path,
                              "link": link, "mode": stat.S_IMODE(st.st_mode), "mtime_ns": st.st_mtime_ns}
    return files, sorted(dangling, key=lambda d: d["file"]), sorted(partials)


def _problem(kind, file=None, expected=None, actual=None, detail=""):
    return {"kind": kind, "file": file, "expected": expected, "actual": actual, "detail": detail}


def read_regular(path: str, max_bytes: int, strict: bool = False) -> bytes:
    """At most max_bytes of the regular file at `path`, through the one door (files/trust.py): a FIFO, socket or
    device is refused (OSError) before it is opened, never read (a read would block for ever). strict: the one rule
    too (a file root acts on); else any link is followed (a user's cache links its own blobs)."""
    fd, _ = open_file(path, strict=strict, any_link=not strict)
    try:
        return read_fd(fd, max_bytes - 1) if max_bytes > 0 else b""
    finally:
        os.close(fd)


def _refusal(exc: OSError) -> str:
    """ENOENT and the like by name (what callers compare); a refusal of the door (a FIFO, a link) by its words."""
    return exc.why if isinstance(exc, Refused) and exc.errno in (None, 0, errno.EINVAL, errno.ELOOP) else _errname(exc)


def read_json_file(path: str, max_bytes: int = 64 << 20, strict: bool = False):
    """(value, error): error is the errno name, "EMPTY", "BAD_JSON: ..." or why the door refused it ("is a FIFO,
    not a regular file")."""
    try:
        data = read_regular(path, max_bytes, strict)
    except OSError as exc:
        return None, _refusal(exc)
    if not data.strip():
        return None, "EMPTY"
    try:
        return json.loads(data), None
    except ValueError as exc:
        return None, f"BAD_JSON: {str(exc)[:80]}"
    except RecursionError:  # nested past what the parser follows: another user's file in /dev/shm can be this
        return None, "BAD_JSON: nests too deeply to read"


def _resolve_hf(repo: str, revision: str, problems: list, notes: list) -> tuple[str | None, str | None]:
    """The snapshot dir and commit of a cache repo folder, adding ref_missing/snapshot_missing problems."""
    snaps = os.path.join(repo, "snapshots")
    try:
        have = sorted(d for d in os.listdir(snaps) if os.path.isdir(os.path.join(snaps, d)))
    except OSError:
        have = []
    if HEX40.match(revision):
        commit = revision
    else:
        ref = os.path.join(repo, "refs", *revision.split("/"))
        try:
            commit = read_regular(ref, 4096).decode("utf-8", "replace").strip()
        except OSError as exc:
            if len(have) == 1:
                notes.append(f"refs/{revision} missing ({_refusal(exc)}); using the only snapshot {have[0]}")
                problems.append(_problem("ref_missing", f"refs/{revision}", detail=_refusal(exc)))
                return os.path.join(snaps, have[0]), have[0]
            problems.append(_problem("ref_missing", f"refs/{revision}", detail=f"{_refusal(exc)}; snapshots: "
                                     + (", ".join(h[:12] for h in have) or "none")))
            return None, None
        if not commit:
            problems.append(_problem("ref_missing", f"refs/{revision}", detail="empty ref file"))
            return None, None
    snap = os.path.join(snaps, commit)
    if not os.path.isdir(snap):
        problems.append(_problem("snapshot_missing", f"snapshots/{commit}",
                                 detail=f"refs/{revision} names {commit} but it is not in snapshots/ (have: "
                                 + (", ".join(h[:12] for h in have) or "none") + ")"))
        return None, commit
    return snap, commit


STALE_DOWNLOAD_S = 600.0  # a *.incomplete blob untouched this long is an aborted download, not one running


def _blobs_linked(snapshot_dir: str) -> set[str]:
    """The blob names (sha) the links of one HF snapshot directory point at."""
    out: set[str] = set()
    for root, _dirs, names in os.walk(snapshot_dir):
        for n in names:
            full = os.path.join(root, n)
            if os.path.islink(full):
                out.add(os.path.basename(os.readlink(full)))
    return out


def verify_model(path: str, revision: str = "main") -> dict:
    """Everything about one model path, without reading tensor data. Never raises for a bad path.

    Returns {"path", "kind": dir|hf_repo|not_found|not_a_dir|not_a_model|hf_cache_root|models_root (then "models":
    the model directories inside), "bad_input": str|None,
    "complete", "dir" (the directory holding the files), "revision", "problems": [{kind, file, expected, actual,
    detail}], "notes", "weights": {format, index, shards, bytes}, "files": {rel: size}, "bytes", "partials",
    "marker", "marker_error"}.
    """
    t0 = time.perf_counter()
    rep: dict = {"path": path, "kind": None, "bad_input": None, "complete": False, "dir": None, "revision": None,
                 "problems": [], "notes": [], "weights": {"format": None, "index": None, "shards": 0, "bytes": 0},
                 "files": {}, "bytes": 0, "partials": [], "marker": None, "marker_error": None, "seconds": 0.0,
                 "others_control": None}
    problems, notes = rep["problems"], rep["notes"]
    try:
        st = os.stat(path)
    except OSError as exc:
        rep["kind"] = "not_found"
        rep["bad_input"] = ("no such directory" if exc.errno == errno.ENOENT else f"cannot stat: {_errname(exc)}")
        return rep
    if not stat.S_ISDIR(st.st_mode):
        rep["kind"] = "not_a_dir"
        rep["bad_input"] = "not a directory (give the model directory or a models--org--name cache folder)"
        return rep
    rep["others_control"] = others_control(path)
    if rep["others_control"]:
        notes.append(f"{rep['others_control']}: contents can change after verification")

    model_dir = path
    if is_hf_repo(path):
        rep["kind"] = "hf_repo"
        blobs = os.path.join(path, "blobs")
        try:
            incompletes = sorted(b for b in os.listdir(blobs) if b.endswith(".incomplete"))
        except OSError:
            incompletes = []
        model_dir, rep["revision"] = _resolve_hf(path, revision, problems, notes)
        if model_dir is None:
            rep["seconds"] = time.perf_counter() - t0
            return rep
        wanted = _blobs_linked(model_dir) if incompletes else set()
        now = time.time()
        for b in incompletes:
            try:
                bst = os.stat(os.path.join(blobs, b))
                size, age = bst.st_size, now - bst.st_mtime
            except OSError:
                size, age = None, 0.0
            # huggingface_hub writes blobs/<etag>.incomplete, renames it, then links it into the snapshot: a blob
            # written lately may be a file of this revision still on its way (the directory may still change)
            if b[: -len(".incomplete")] in wanted or age < STALE_DOWNLOAD_S:
                problems.append(_problem("incomplete_blob", f"blobs/{b}", actual=size,
                                         detail="an interrupted download (huggingface_hub writes *.incomplete)"))
            else:  # #41: an old aborted download that no file links to does not make this revision incomplete
                notes.append(f"blobs/{b}: a download interrupted {age / 3600:.0f} h ago that no file of revision "
                             f"{rep['revision'] or '?'} links to (left alone; rm removes it)")
    else:
        repos = _hf_root_repos(path)
        if repos:
            rep["kind"] = "hf_cache_root"
            rep["bad_input"] = ("is a Hugging Face cache root; name one repo folder: "
                                + ", ".join(repos[:4]) + (" ..." if len(repos) > 4 else ""))
            return rep
        rep["kind"] = "dir"
    rep["dir"] = model_dir

    files, dangling, partials = walk_files(model_dir)
    rep["partials"] = partials
    marker, merr = read_json_file(os.path.join(model_dir, MARKER_NAME))
    if merr is None and not (isinstance(marker, dict) and marker.get("schema") == MARKER_SCHEMA):
        marker, merr = None, "NOT_A_MARKER"
    rep["marker"], rep["marker_error"] = marker, merr
    marker_sizes = {}
    if marker:
        marker_sizes = {f.get("name"): f.get("size") for f in marker.get("files", []) if isinstance(f, dict)}

    try:
        entries = os.listdir(model_dir)
    except OSError:
        entries = []
    names = list(files) + [d["file"] for d in dangling]
    looks_like_model = (marker or partials or ".cache" in entries
                        or any(n.rsplit("/", 1)[-1] in _MODEL_SIGNS or n.endswith(WEIGHT_SUFFIXES + (INDEX_SUFFIX,))
                               for n in names))
    children = _child_models(names) if rep["kind"] == "dir" and not marker else []
    if children:  # a folder of models (e.g. /dev/shm holding several): verifying it as one would call it incomplete
        rep["kind"] = "models_root"
        rep["models"] = [os.path.join(path, c) for c in children]
        rep["bad_input"] = (f"not a model directory: it holds {len(children)} model director"
                            f"{'y' if len(children) == 1 else 'ies'}: " + ", ".join(children[:8])
                            + (" ..." if len(children) > 8 else "") + "; verify each one")
        return rep
    if rep["kind"] == "dir" and entries and not looks_like_model:
        rep["kind"] = "not_a_model"
        rep["bad_input"] = "not a model directory (no config.json, no weights, no index)"
        return rep
    if not entries:
        problems.append(_problem("empty", detail="the directory is empty (a wiped tmpfs leaves this)"))

    for d in dangling:
        problems.append(_problem("dangling_symlink", d["file"], detail=f"-> {d['target']} does not exist"))
    dangling_names = {d["file"] for d in dangling}

    # config.json
    if "config.json" in files:
        _, err = read_json_file(os.path.join(model_dir, "config.json"))
        if err:
            problems.append(_problem("bad_json", "config.json", actual=files["config.json"]["size"], detail=err))
    elif "config.json" not in dangling_names:
        problems.append(_problem("missing", "config.json", expected=marker_sizes.get("config.json"),
                                 detail="every model directory has one"))

    # the weights: every *.safetensors in the tree is checked by its header; index files name the required shards
    weights = rep["weights"]
    st_files = {rel: info for rel, info in files.items() if rel.endswith(".safetensors")}
    checked: dict = {}
    for rel, info in sorted(st_files.items()):
        checked[rel] = check_safetensors(os.path.join(model_dir, rel))
    required: dict = {}  # shard rel -> index rel
    tensor_map: dict = {}
    indexes = sorted(rel for rel in files if rel.endswith(INDEX_SUFFIX) and "/" not in rel)
    for idx in indexes:
        data, err = read_json_file(os.path.join(model_dir, idx))
        wm = data.get("weight_map") if isinstance(data, dict) else None
        if err or not isinstance(wm, dict) or not wm:
            problems.append(_problem("bad_index", idx, actual=files[idx]["size"],
                                     detail=err or "no weight_map object (or it is empty)"))
            continue
        weights["index"] = weights["index"] or idx
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
        if isinstance(meta.get("total_size"), int):
            weights["index_total_size"] = weights.get("index_total_size", 0) + meta["total_size"]
        for tensor, shard in wm.items():
            if not isinstance(shard, str) or not shard:
                continue
            required.setdefault(shard, idx)
            tensor_map.setdefault(shard, []).append(tensor)
    if weights["index"]:
        weights["format"] = "safetensors" if weights["index"].endswith(".safetensors.index.json") else "other"
    elif st_files:
        weights["format"] = "safetensors"
    elif any(rel.endswith(WEIGHT_SUFFIXES) for rel in files):
        weights["format"] = "other"

    missing_shards = []
    for shard in sorted(required):
        if shard in dangling_names:
            missing_shards.append(shard)
            continue
        if shard not in files:
            missing_shards.append(shard)
            problems.append(_problem("missing", shard, expected=marker_sizes.get(shard),
                                     detail=f"named by {required[shard]}"))
            continue
        if shard.endswith(".safetensors") and shard in checked:
            names = set(checked[shard]["tensors"])
            if checked[shard]["kind"] == "ok":
                absent = [t for t in tensor_map[shard] if t not in names]
                if absent:
                    problems.append(_problem("tensor_not_in_shard", shard, detail=(
                        f"{len(absent)} tensor(s) the index maps here are not in its header, e.g. {absent[0]!r} "
                        "(a shard from another revision?)")))
        elif files[shard]["size"] == 0:
            problems.append(_problem("truncated", shard, actual=0, detail="empty weight file"))
    for rel, c in sorted(checked.items()):
        if c["kind"] != "ok":
            expected = c["expected"] if c["expected"] is not None else marker_sizes.get(rel)
            problems.append(_problem(c["kind"], rel, expected=expected, actual=c["size"], detail=c["detail"]))
    weight_files = sorted(set(required) | set(st_files) | {r for r in files if r.endswith(WEIGHT_SUFFIXES)})
    weights["shards"] = len(weight_files)
    weights["bytes"] = sum(files[r]["size"] for r in weight_files if r in files)
    weights["data_bytes"] = sum(c["expected"] - 8 - c["header_len"] for c in checked.values() if c["kind"] == "ok")
    present_weights = [r for r in weight_files if r in files]
    if not present_weights:
        if required:
            problems.append(_problem("metadata_only", detail=(
                f"{weights['index']} names {len(required)} shard(s); none is present")))
        elif files:
            problems.append(_problem("metadata_only", detail="no weight files (*.safetensors, *.bin, ...)"))

    # huggingface-cli download --local-dir keeps partial files under .cache/huggingface/download/
    dl = os.path.join(model_dir, ".cache", "huggingface", "download")
    if os.path.isdir(dl):
        for dirpath, _, names in os.walk(dl):
            for nm in names:
                if nm.endswith(".incomplete"):
                    rel = os.path.relpath(os.path.join(dirpath, nm), model_dir)
                    problems.append(_problem("incomplete_blob", rel, detail="an interrupted download"))

    # the staging marker lists every file with its size: a file gone since staging is a problem
    if marker:
        for f in marker.get("files", []):
            name, size = (f.get("name"), f.get("size")) if isinstance(f, dict) else (None, None)
            if not isinstance(name, str) or name in required or name == "config.json" or name in dangling_names:
                continue
            if name not in files:
                problems.append(_problem("missing", name, expected=size, detail=f"listed in {MARKER_NAME}"))
            elif isinstance(size, int) and files[name]["size"] != size and name not in checked:
                problems.append(_problem("size_mismatch", name, expected=size, actual=files[name]["size"],
                                         detail=f"size differs from {MARKER_NAME}"))
            elif isinstance(size, int) and name in checked and checked[name]["kind"] == "ok" \
                    and files[name]["size"] != size:
                problems.append(_problem("size_mismatch", name, expected=size, actual=files[name]["size"],
                                         detail=f"size differs from {MARKER_NAME}"))
    for p in partials:
        notes.append(f"leftover partial copy {p} (an interrupted `model stage`)")

    rep["files"] = {rel: info["size"] for rel, info in sorted(files.items())}
    rep["bytes"] = sum(rep["files"].values())
    rep["complete"] = not problems
    rep["seconds"] = time.perf_counter() - t0
    return rep


# --- hashing (opt-in: reads every byte) ------------------------------------------------------------------------
def hash_targets(rep: dict) -> list[dict]:
    """What `--hash` can check: HF blobs (LFS sha256 or git sha1 by name) and marker sha256 entries."""
    out = []
    d = rep.get("dir")
    if not d:
        return out
    marker_sha = {}
    if rep.get("marker"):
        marker_sha = {f["name"]: f["sha256"] for f in rep["marker"].get("files", [])
                      if isinstance(f, dict) and isinstance(f.get("sha256"), str)}
    for rel, size in rep["files"].items():
        full = os.path.join(d, rel)
        if rep["kind"] == "hf_repo" and os.path.islink(full):
            blob = os.path.realpath(full)
            name = os.path.basename(blob)
            if HEX64.match(name):
                out.append({"file": rel, "path": blob, "algo": "sha256", "expected": name, "size": size})
            elif HEX40.match(name):
                out.append({"file": rel, "path": blob, "algo": "git-sha1", "expected": name, "size": size})
        elif rel in marker_sha:
            out.append({"file": rel, "path": full, "algo": "sha256", "expected": marker_sha[rel], "size": size})
    return out


def hash_file(target: dict, on_bytes=None, bufsize: int = 8 << 20) -> str:
    """The hex digest of target["path"] by target["algo"]; on_bytes(n) reports progress."""
    if target["algo"] == "git-sha1":
        h = hashlib.sha1(b"blob %d\0" % target["size"])
    else:
        h = hashlib.sha256()
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    with os.fdopen(_open_model_file(target["path"]), "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(mv[:n])
            if on_bytes:
                on_bytes(n)
    return h.hexdigest()


# --- where the path lives: mounts, statvfs, memory cgroup ------------------------------------------------------
def _unescape_mount(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def parse_mounts(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out.append({"source": _unescape_mount(parts[0]), "mountpoint": _unescape_mount(parts[1]),
                        "fstype": parts[2], "options": parts[3]})
    return out


def mount_of(path: str, mounts: list[dict]) -> dict | None:
    """The mount holding `path` (already resolved): longest mountpoint prefix; the last of equals wins (overmount)."""
    best, best_len = None, -1
    for m in mounts:
        mp = m["mountpoint"].rstrip("/") or "/"
        if path == mp or path.startswith(mp.rstrip("/") + "/") or mp == "/":
            if len(mp) >= best_len:
                best, best_len = m, len(mp)
    return best


def nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p) and p != os.path.dirname(p):
        p = os.path.dirname(p)
    return p


def statvfs(path: str) -> dict:
    try:
        s = os.statvfs(path)
    except OSError as exc:
        return {"error": _errname(exc)}
    return {"total": s.f_blocks * s.f_frsize, "free": s.f_bfree * s.f_frsize, "avail": s.f_bavail * s.f_frsize}


def read_text(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _int_or_none(text: str | None):
    if text is None:
        return None
    t = text.strip()
    if t == "max":
        return "max"
    try:
        return int(t)
    except ValueError:
        return None


def _stat_kv(text: str | None) -> dict:
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            out[k] = int(v)
    return out


def memory_cgroup(root: str, mounts: list[dict]) -> dict:
    """The memory cgroup of this process and its ancestors: limit, usage, inactive file cache, headroom.

    headroom = min over limited levels of (limit - (usage - inactive_file)): the working set, as kubelet counts it.
    Pages of tmpfs files count in usage (and are not inactive_file while unswappable), so staging a model into
    tmpfs needs headroom >= its size.
    """
    out: dict = {"version": None, "path": None, "levels": [], "limit": None, "headroom": None, "error": None}
    text = read_text(root + "/proc/self/cgroup")
    if text is None:
        out["error"] = "cannot read /proc/self/cgroup"
        return out
    v1_path = v2_path = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif "memory" in parts[1].split(","):
            v1_path = parts[2]
    if v1_path is not None:
        base = next((m["mountpoint"] for m in mounts if m["fstype"] == "cgroup"
                     and "memory" in m["options"].split(",")), "/sys/fs/cgroup/memory")
        out.update(version=1, path=v1_path)
        files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    elif v2_path is not None:
        base = next((m["mountpoint"] for m in mounts if m["fstype"] == "cgroup2"), "/sys/fs/cgroup")
        out.update(version=2, path=v2_path)
        files = ("memory.max", "memory.current", "inactive_file")
    else:
        out["error"] = "no memory cgroup in /proc/self/cgroup"
        return out
    rel = out["path"].strip("/")
    leaf = root + base + ("/" + rel if rel else "")
    if not os.path.isdir(leaf):  # a cgroup namespace or a bind mount of our own cgroup: the mount is our cgroup
        out["note"] = f"{base}/{rel} not visible; using {base} (the mount is this process's cgroup)"
        leaf = root + base
    d = leaf
    while True:
        lim = _int_or_none(read_text(os.path.join(d, files[0])))
        cur = _int_or_none(read_text(os.path.join(d, files[1])))
        if cur is not None:
            if out["version"] == 1 and isinstance(lim, int) and lim >= (1 << 62):
                lim = "max"
            st = _stat_kv(read_text(os.path.join(d, "memory.stat")))
            inactive = st.get(files[2], 0)
            lvl = {"dir": d[len(root):] if root else d, "max": None if lim == "max" else lim, "current": cur,
                   "inactive_file": inactive, "shmem": st.get("shmem", st.get("total_shmem"))}
            out["levels"].append(lvl)
            if isinstance(lvl["max"], int):
                room = lvl["max"] - max(0, cur - inactive)
                if out["headroom"] is None or room < out["headroom"]:
                    out["headroom"], out["limit"] = room, lvl["max"]
        if d.rstrip("/") == (root + base).rstrip("/") or len(d) <= len(root + base):
            break
        d = os.path.dirname(d)
    return out


def meminfo(root: str) -> dict:
    out = {}
    for line in (read_text(root + "/proc/meminfo") or "").splitlines():
        k, _, v = line.partition(":")
        f = v.split()
        if k in ("MemTotal", "MemAvailable", "Shmem", "SwapFree") and f and f[0].isdigit():
            out[k] = int(f[0]) * (1024 if len(f) > 1 and f[1] == "kB" else 1)
    return out


def boot_id(root: str = "") -> str | None:
    t = read_text(root + "/proc/sys/kernel/random/boot_id")
    return t.strip() if t else None


def state_dirs(root: str = "") -> list[str]:
    """Where persistent stage records live: $GPUDOCTOR_STATE_DIR, else /var/lib/gpudoctor and the user's state dir."""
    env = os.environ.get("GPUDOCTOR_STATE_DIR")
    if env:
        return [env]
    return default_state_dirs(root)


def default_state_dirs(root: str = "") -> list[str]:
    """The state directories without $GPUDOCTOR_STATE_DIR: /var/lib/gpudoctor and the user's state dir."""
    home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return [root + "/var/lib/gpudoctor", os.path.join(home, "gpudoctor")]


def record_dirs(root: str = "") -> list[str]:
    """Where read_record looks for stage records (<state dir>/staged), shown without the test root."""
    return [os.path.join(d[len(root):] if root and d.startswith(root) else d, STATE_SUBDIR) for d in state_dirs(root)]


def record_elsewhere(dst: str, root: str = "") -> str | None:
    """A trusted stage record of dst in a known state directory read_record does not look in (the default ones
    while $GPUDOCTOR_STATE_DIR names another): staged by a gpudoctor with another state directory."""
    looked = {os.path.normpath(d) for d in state_dirs(root)}
    for d in default_state_dirs(root):
        if os.path.normpath(d) in looked:
            continue
        p = os.path.join(d, STATE_SUBDIR, record_key(dst) + ".json")
        val, err = read_json_file(p, strict=True)  # trusted by the one rule, read from the fd judged
        if err is None and isinstance(val, dict):
            return p[len(root):] if root and p.startswith(root) else p
    return None


def record_key(dst: str) -> str:
    a = os.path.abspath(dst)
    return hashlib.sha256(a.encode()).hexdigest()[:16] + "-" + (os.path.basename(a) or "root")


def others_control(path: str) -> str | None:
    """Whether someone other than root and this user can change what lies in `path` (a model directory): why, in one
    line ("/dev/shm/m: owned by eve (uid 1001), mode 0755, not root's"), or None. The one rule (files/trust.py's
    refusal), the same that `model stage` applies to its DST: the per-start gate does not pass what staging refuses."""
    r = refusal(path)
    return str(r) if r is not None and r.rule else None


def read_record(dst: str, root: str = "") -> tuple[dict | None, str | None]:
    """The persistent record of the last stage into dst (survives the tmpfs wipe), and where it was read. A record
    another user could have written is not read (#40: a restage takes its source from it): the one rule, judged on
    the fd read (files/trust.py)."""
    for d in state_dirs(root):
        p = os.path.join(d, STATE_SUBDIR, record_key(dst) + ".json")
        val, err = read_json_file(p, strict=True)
        if err is None and isinstance(val, dict):
            return val, p
    return None, None


def fill_expected(rep: dict, record: dict | None) -> None:
    """Missing files whose size the directory cannot tell (the marker was wiped with it) get it from the record."""
    sizes = {f.get("name"): f.get("size") for f in (record or {}).get("files") or [] if isinstance(f, dict)}
    for pr in rep["problems"]:
        if pr.get("expected") is None and isinstance(sizes.get(pr.get("file")), int):
            pr["expected"] = sizes[pr["file"]]
            pr["detail"] = (pr.get("detail") + "; " if pr.get("detail") else "") + "size from the stage record"


def probe(paths: list[str], root: str = "", revision: str = "main") -> dict:
    """The `model` facts for gather: per path its mount, room, verification, marker and stage record; plus boot
    id, meminfo and the memory cgroup. `root` prefixes every absolute path (tests)."""
    t0 = time.perf_counter()
    mounts_text = read_text(root + "/proc/mounts") or ""
    mounts = parse_mounts(mounts_text)
    out = {"schema": SCHEMA, "boot_id": boot_id(root), "now": time.time(), "meminfo": meminfo(root),
           "cgroup": memory_cgroup(root, mounts), "paths": [], "mounts_error": None if mounts else "no /proc/mounts"}
    for p in paths:
        full = root + p if root and p.startswith("/") else p
        near = nearest_existing(full)
        real = os.path.realpath(near)
        shown = real[len(root):] or "/" if root and real.startswith(root) else real
        m = mount_of(shown, mounts)
        rep = verify_model(full)
        for key in ("path", "dir"):
            if root and isinstance(rep.get(key), str) and rep[key].startswith(root):
                rep[key] = rep[key][len(root):] or "/"
        rec, rec_at = read_record(p, root)
        fill_expected(rep, rec)
        out["paths"].append({
            "path": p, "exists": os.path.isdir(full), "nearest_existing": near[len(root):] if root else near,
            "mount": None if m is None else dict(m, tmpfs=m["fstype"] in ("tmpfs", "ramfs")),
            "statvfs": statvfs(near), "verify": rep, "record": rec, "record_path": rec_at,
            "record_dirs": record_dirs(root), "record_elsewhere": None if rec else record_elsewhere(p, root),
        })
    out["seconds"] = time.perf_counter() - t0
    return out


if __name__ == "__main__":  # run on a target by gather/model.py: python3 -c SOURCE '{"paths": [...]}'
    _args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    print(json.dumps(probe(_args.get("paths", []), _args.get("root", ""), _args.get("revision", "main"))))
