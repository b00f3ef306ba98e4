"""One door for files (#47 item 2): outside files/trust.py no module opens or stats a path by itself.

The test walks the package's syntax trees and flags every call of open(), os.open, os.stat, os.lstat, io.open,
X.open(), X.read_text() and X.read_bytes(). Each one outside the door must be listed below, by file and a piece of
the call's text, with the reason it is not a path another user might control (a /proc or /sys file, the package's own
text, a file of gpudoctor's own state in root's directories, the target-side transports). A new raw open fails here:
route it through files/trust.py (open_file, read_file) or files/inputs.py (read_bytes/read_text/read_json, `obeyed=`
for what root obeys). Entries marked "gap:" are known reads by name that belong to another concern's owner and are
named in docs/security.md as not yet through the door.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gpudoctor

PKG = Path(gpudoctor.__file__).resolve().parent
ROOTS = [PKG] + [PKG.parent / d for d in ("checks", "remedies") if not (PKG / d).exists() and (PKG.parent / d).exists()]
DOOR = {"files/trust.py"}  # the one door; files/safe.py and files/inputs.py are built on its fds
PROC = "a /proc or /sys file of the kernel's (no user can plant it)"
OWN_TEXT = "the package's own text or data (root's install)"
STATE = "gpudoctor's own state file under its state directory, which files/safe.py made root's (owned_dir)"

# file -> [(piece of the call's text, why)]
ALLOWED = {
    "files/safe.py": [("os.open(name, _DIR, dir_fd=fd)", "a directory it just created, relative to a door fd"),
                      ("/proc/self/fd/", "a second description of an fd already judged"),
                      ("os.stat(name, dir_fd=dfd, follow_symlinks=False)", "whether the name is a directory, "
                       "relative to a door fd, never followed")],
    "files/atomic.py": [("target.read_bytes()", "gap: the JSONL it appends to, named by its writer (a result file "
                         "in --out, which files/safe.py made root's)")],
    "host/ops.py": [("", "the target-side transports: Host's file operations on the target (read O_NONBLOCK and "
                     "regular-checked) and the mutation seam")],
    "host/base.py": [(".read_text()", OWN_TEXT)],
    "host/forked.py": [("os.devnull", "/dev/null")],
    "cli.py": [("os.devnull", "/dev/null")],
    "host/ssh.py": [("open(path, \"rb\")", "its own known_hosts file, opened for append through the seam just above "
                     "(fs_open) and read back")],
    "host/sshd_limits.py": [("os.stat(path)", "a key file's identity (mtime, size) for a cache key; never read here")],
    "model/probe.py": [("os.stat(", "sizes of a model's own files (walk_files) and blobs; every open is the door's"),
                       ("open(path)", "read_text: /proc and /sys files (mounts, cgroup, meminfo, boot id)")],
    "model/stage.py": [("os.lstat(dst)", "only to name the owner of a DST that is a link, in the refusal"),
                       ("os.stat(", "sizes for the plan's room check; the copy opens through the door"),
                       ("/proc/", PROC), ("probe.read_text(\"/proc/mounts\")", PROC)],
    "model/verify.py": [("/proc/mounts", PROC)],
    "gather/deep_python.py": [(".read_text()", OWN_TEXT)],
    "gather/model.py": [(".read_text()", OWN_TEXT)],
    "catalog/deep_limits.py": [("os.stat(site)", "the site table's identity for the cache key; it is read through "
                                "the door (inputs.read_json obeyed)"), ("resources.files", OWN_TEXT)],
    "catalog/xid.py": [("resources.files", OWN_TEXT)],
    "buildinfo.py": [("open(path", "the install's own build stamp")],
    "host/local.py": [("/proc/sys/kernel/random/boot_id", PROC)],
    "gather/deep_timeline.py": [("/proc/self/stat", PROC)],
    "gather/procs.py": [("Path(path).read_text(", OWN_TEXT)],
    "daemon/clock.py": [("self.path.read_text()", "tests' fake clock file ($GPUDOCTOR_TEST_CLOCK)")],
    "daemon/state.py": [(".read_text()", STATE)],
    "recovery/gates.py": [("daemon.json", STATE), ("/proc/", PROC)],
    "remedy.py": [("open(self.path, \"rb\")", "the audit log, opened by fd through the seam first and read back")],
    "sglang/differential.py": [(".read_text()", "the differential tool's corpus in the checkout")],
    "sglang/resolver.py": [("open(smi, \"w\")", "a fake nvidia-smi in the resolver's own mkdtemp scratch")],
    "sglang/modelcfg.py": [("open(path, encoding=\"utf-8\")", "gap: a line number for a message, after the file was "
                            "read through inputs.read_text")],
    "bench/cell/health.py": [("", "the sampler runs on the target as its own stdlib program: /proc, the kernel log, "
                              "its own output files")],
    "bench/cell/provenance.py": [("/proc/", PROC), ("{base}/{n}/cpulist", PROC),
                                 ("open(path, \"rb\")", "gap: a hash of the server binary for provenance (recorded, "
                                  "never obeyed)")],
    "bench/client/levels.py": [("open(path, encoding=\"utf-8\")", "gap: the prompt corpus (data sent to the server, "
                                "never obeyed)")],
    "bench/client/prompts.py": [("path.read_text(", "gap: the prompt corpus (data, never obeyed)")],
    "bench/server/launch.py": [("open(self.log_path", "the server's log, appended by the server itself"),
                               ("/proc/", PROC), ("Path(pid_file).read_text()", "the pid file in --out (root's)")],
    "bench/server/remote.py": [("open(self.log_path", "a local mirror of the server's log")],
    "bench/server/logscan.py": [("open(self.path, \"rb\")", "the server's log in --out (root's)"),
                                ("resources", OWN_TEXT)],
    "gather/marker.py": [("/proc/", PROC)],
    "bench/standin/server.py": [("", "the stand-in inference server (tests and demos): its own logs")],
    "bench/records/report.py": [("heals.jsonl", "a result file in a result directory (read back)")],
    "bench/records/results.py": [("kept_before.read_text()", "a result file in --out (root's, owned_dir)")],
    "campaign/heal.py": [("heals.jsonl", "a result file in --out (root's, owned_dir)")],
    "campaign/runner.py": [("os.stat(lock_path)", "the --out lock's identity, after it was opened O_NOFOLLOW"),
                                 ("pid_file.read_text()", "the pid file in --out (root's)"),
                                 ("config.json", "gap: the model's config.json for provenance (recorded, never "
                                  "obeyed)")],
    "campaign/slurm.py": [(".read_text(", "its own state and job output files in --out (root's)")],
}

_ATTRS = {("os", "open"), ("os", "stat"), ("os", "lstat"), ("io", "open")}


def _calls(tree, src):
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name) and f.id == "open":
            hit = True
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            hit = ((base, f.attr) in _ATTRS or f.attr in ("read_text", "read_bytes")
                   or (f.attr == "open" and base not in ("os", "io")))
        else:
            hit = False
        if hit:
            yield n.lineno, " ".join((ast.get_source_segment(src, n) or "").split())


def raw_opens(roots=None):
    """(relative path, line, call text) of every open/stat outside the door that ALLOWED does not name."""
    out = []
    for root in roots or ROOTS:
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root).as_posix() if root == PKG else f"{root.name}/{p.relative_to(root).as_posix()}"
            if rel in DOOR:
                continue
            src = p.read_text()
            for line, text in _calls(ast.parse(src), src):
                if not any(piece in text for piece, _ in ALLOWED.get(rel, [])):
                    out.append((rel, line, text))
    return out


def test_no_module_outside_the_door_opens_a_path_by_itself():
    bad = [f"{rel}:{line}: {text[:120]}" for rel, line, text in raw_opens()]
    assert not bad, ("opens or stats of a path outside files/trust.py (route it through the door, or list it in "
                     "ALLOWED with why it is not a path another user might control):\n" + "\n".join(bad))


def test_a_raw_open_in_the_inventory_loader_is_caught(tmp_path):
    """The scan sees a new raw read: inventory.py as it is passes, with `open(p)` and `Path(p).read_text()` added
    it fails (so does an os.stat of an input in model/stage.py, whose exceptions are only the ones listed)."""
    fake = tmp_path / "gpudoctor"
    (fake / "model").mkdir(parents=True)
    (fake / "inventory.py").write_text((PKG / "inventory.py").read_text())
    assert raw_opens([fake]) == []
    (fake / "inventory.py").write_text((PKG / "inventory.py").read_text()
                                       + "\n\ndef _sneak(p):\n    return open(p).read() + Path(p).read_text()\n")
    (fake / "model" / "stage.py").write_text("import os\nos.lstat(src)\n")
    found = sorted(t for _, _, t in raw_opens([fake]))
    assert found == ["Path(p).read_text()", "open(p)", "os.lstat(src)"], found


def test_every_allowed_entry_still_matches_a_call():
    """An exception that no longer matches anything is removed, so the list stays the truth."""
    used = {}
    for root in ROOTS:
        for p in root.rglob("*.py"):
            rel = p.relative_to(root).as_posix() if root == PKG else f"{root.name}/{p.relative_to(root).as_posix()}"
            src = p.read_text()
            for _, text in _calls(ast.parse(src), src):
                for piece, _ in ALLOWED.get(rel, []):
                    if piece in text:
                        used.setdefault(rel, set()).add(piece)
    stale = [f"{rel}: {piece!r}" for rel, pieces in ALLOWED.items() for piece, _ in pieces
             if piece not in used.get(rel, set())]
    assert not stale, "ALLOWED entries that match no call any more:\n" + "\n".join(stale)
