"""The states a power cut can leave (issue #48, item 1), built from a writer's recorded trace the way ALICE and LazyFS
build them, on the model of ext4 data=ordered with delayed allocation, auto_da_alloc off (the worst case of that file
system; docs/testing.md "Power-loss states"):

- metadata (create, mkdir, mknod, rename, unlink, chmod, chown, utime, O_TRUNC/ftruncate) goes through the journal
  in order: a cut keeps a PREFIX of it. Any fsync or directory fsync commits the journal up to that step (ext4 has
  one running transaction), so the prefix reaches at least the last barrier before the cut and at most the cut. A
  rename or a create not yet followed by a barrier is undone, with everything after it;
- data of a regular file is durable up to its last fsync. What it was given after that (or, never fsynced, all of
  it) may be there whole, lost whole (delayed allocation: a new file is empty, an old one keeps what it had at its
  last fsync, or nothing after a journaled truncate), or cut at a 4 KiB page boundary (writeback of one page);
  files are judged one at a time against the others kept, and all at once (all kept, all lost).

The worlds the harness already has, W[k] = the tree a run killed after k steps leaves (W[n]: an uninterrupted run),
are the material: a state for (cut k, journal prefix m) is W[m]'s names, kinds and modes with each file's data
chosen as above from the W[j] of that file's last fsync j < k. An inode is followed across renames by replaying the
trace's names, so the data of `.x.tmp` fsynced and renamed to `x` is `x`'s."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

PAGE = 4096
META = {"create", "truncate", "mkdir", "mknod", "rename", "unlink", "chmod", "chown", "utime"}
BARRIER = {"fsync", "fsync-dir"}


@dataclass
class Inodes:
    """The trace's names replayed: after[i] is {tree key: inode} after i steps (after[0]: the world before)."""

    after: list
    fsyncs: dict  # inode -> [step index of each fsync]
    truncs: dict  # inode -> [step index of each O_TRUNC or ftruncate]
    born: dict  # inode -> step index of its create (absent: it was there before the run)
    touched: set  # inodes a step of the trace acted on (others, a stand-in tool's files, keep what they hold)


def keyer(roots: list):
    reals = [os.path.realpath(r) for r in roots]

    def key(path: str) -> str | None:
        path = os.path.normpath(path)
        for i, r in enumerate(reals):
            if path == r or path.startswith(r + "/"):
                return f"{i}:{os.path.relpath(path, r)}"
        return None

    return key


def replay(steps: list, before: dict, roots: list) -> Inodes:
    key = keyer(roots)
    names = {k: n for n, k in enumerate(sorted(before))}
    nxt = [len(names)]
    after = [dict(names)]
    fsyncs: dict = {}
    truncs: dict = {}
    born: dict = {}
    touched: set = set()

    def new(k: str, i: int) -> None:
        names[k] = nxt[0]
        born[nxt[0]] = i
        nxt[0] += 1

    for i, (op, path, detail, _tid) in enumerate(steps):
        k = key(path)
        if k is not None:
            if op in ("create", "truncate") and k not in names:
                new(k, i)
            elif op == "truncate":
                truncs.setdefault(names[k], []).append(i)
            elif op in ("mkdir", "mknod"):
                new(k, i)
            elif op == "rename":
                dst = key(detail[0])
                ino = names.pop(k, None)
                if dst is not None:
                    names.pop(dst, None)
                    if ino is not None:
                        names[dst] = ino
                        # a directory renamed carries what lies under it
                        for sub in [s for s in names if s.startswith(k + "/")]:
                            names[dst + sub[len(k):]] = names.pop(sub)
            elif op == "unlink":
                names.pop(k, None)
            elif op == "fsync" and k in names:
                fsyncs.setdefault(names[k], []).append(i)
            for p in (k, key(detail[0]) if op == "rename" else None):
                if p in names:
                    touched.add(names[p])
        after.append(dict(names))
    return Inodes(after, fsyncs, truncs, born, touched)


def _name_of(names: dict, ino: int) -> str | None:
    return next((k for k, v in names.items() if v == ino), None)


def _data(world: dict, k: str | None):
    v = world.get(k) if k is not None else None
    return v[1] if v is not None and v[0] == "file" else None


def states(steps: list, worlds: list, roots: list):
    """Yield (label, tree) for every distinct power-loss state of the trace (worlds[k] for k in 0..len(steps)).
    A cut after step k keeps the journal up to some step m, last barrier <= m <= k; what the state holds depends on m
    alone (data written after m that makes a file longer needs a later commit; the trace's writers only make files
    longer), so every m from 0 to the end is one cut, and every file's data is W[m]'s or its durable part."""
    ino = replay(steps, worlds[0], roots)
    seen: set = set()
    for m in range(len(steps) + 1):
        for label, tree in _at(m, ino, worlds):
            h = _digest(tree)
            if h in seen:
                continue
            seen.add(h)
            yield f"power cut, journal up to step {m}, {label}", tree


def returned(steps: list, worlds: list, roots: list) -> dict:
    """The least a power cut right after the run returned can leave: the journal up to the run's last barrier, no
    data that was not fsynced. A writer that returned must have made its work durable: this is its new world."""
    ino = replay(steps, worlds[0], roots)
    m = max([i + 1 for i, s in enumerate(steps) if s[0] in BARRIER], default=0)
    out = list(_at(m, ino, worlds))
    return out[1][1] if len(out) > 1 else out[0][1]


def _at(m: int, ino: Inodes, worlds: list):
    base = worlds[m]
    names_m = ino.after[m]
    lost: dict = {}
    for key, v in base.items():
        if v[0] != "file":
            continue
        i = names_m.get(key)
        if i is None or i not in ino.touched:  # not the trace's (a stand-in tool's): as it is
            continue
        done = [j for j in ino.fsyncs.get(i, []) if j < m]
        if done:
            durable = _data(worlds[done[-1]], _name_of(ino.after[done[-1]], i)) or b""
        elif i in ino.born:
            durable = b""
        else:
            durable = _data(worlds[0], _name_of(ino.after[0], i)) or b""
        if any((done[-1] if done else -1) < t < m for t in ino.truncs.get(i, [])):
            durable = b""
        if durable != v[1]:
            lost[key] = durable

    def build(choice: dict) -> dict:
        out = dict(base)
        for key, data in choice.items():
            out[key] = ("file", data, base[key][2])
        return out

    yield "every file's data written", base
    if not lost:
        return
    yield "no unsynced data", build(lost)
    for key, durable in sorted(lost.items()):
        latest = base[key][1]
        yield f"{key} lost its unsynced data", build({key: durable})
        if len(lost) > 1:
            yield f"only {key} kept its unsynced data", build({**lost, key: latest})
        start = len(durable) if latest.startswith(durable) else 0
        cut = (start // PAGE + 1) * PAGE
        if cut < len(latest):
            yield f"{key} cut at byte {cut}", build({key: latest[:cut]})


def _digest(tree: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(tree):
        v = tree[k]
        h.update(repr((k, v[0], *(x if not isinstance(x, bytes) else hashlib.sha256(x).digest() for x in v[1:])))
                 .encode())
    return h.hexdigest()


def materialize(tree: dict, roots: list) -> None:
    """Write a state to disk at its roots (each removed first): what the invariants and a rerun read."""
    import shutil
    import stat

    for r in roots:
        if os.path.lexists(r):
            shutil.rmtree(r)
    for k in sorted(tree, key=lambda s: (s.split(":", 1)[0], s.count("/"), s)):
        i, rel = k.split(":", 1)
        p = os.path.join(roots[int(i)], rel)
        v = tree[k]
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if v[0] == "dir":
            os.makedirs(p, exist_ok=True)
            os.chmod(p, v[1])
        elif v[0] == "file":
            with open(p, "wb") as fh:
                fh.write(v[1])
            os.chmod(p, v[2])
        elif v[0] == "char":
            os.mknod(p, stat.S_IFCHR | v[3], os.makedev(v[1], v[2]))
            os.chmod(p, v[3])
        elif v[0] == "link":
            os.symlink(v[1], p)
    for r in roots:
        os.makedirs(r, exist_ok=True)
