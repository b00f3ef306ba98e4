"""Whether root may trust a path another user might control (#40): sshd's StrictModes, for files and interpreters.

A path is trusted when every part of it, from "/" down, and every link it passes through to the file it names, is
owned by root or by this process's effective user, and no other user can change it: writable by neither its group
nor others (the rule files/safe.py applies to writes). A world-writable directory with the sticky bit (/tmp,
/dev/shm) may be passed through, since another user can neither rename nor remove what root owns in it; the part after it must
then pass the same test. `untrusted(path)` is None for a trusted path, else one line naming the part, its owner and
its mode.

Stdlib only and standalone (no imports from gpudoctor): gather/deep_python.py sends this file's text to the target, so
an interpreter found there is judged by the same code as a config file here.
"""

import os
import stat


def _owner(uid):
    try:
        import pwd

        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except (ImportError, KeyError):
        return "uid %d" % uid


def untrusted(path, uids=None):
    """None when root may trust `path`; else why not, in one line ("/home/eve/python3: owned by eve (uid 1001), mode
    0755, not root's"). `uids`: the owners trusted (default root and this process's effective user)."""
    ok = set(uids) if uids is not None else {0, os.geteuid()}
    todo = [c for c in reversed(str(path).split("/")) if c]
    if not str(path).startswith("/"):
        todo += [c for c in reversed(os.getcwd().split("/")) if c]
    cur, hops = "/", 0
    parts = ["/"]
    while parts or todo:
        if parts:
            p = parts.pop()
        else:
            c = todo.pop()
            if c == ".":
                continue
            if c == "..":
                cur = os.path.dirname(cur) or "/"
                continue
            p = os.path.join(cur, c)
        try:
            st = os.lstat(p)
        except OSError as e:
            return "%s: %s" % (p, e.strerror or e)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in ok:
            return "%s: owned by %s, mode %04o, not root's" % (p, _owner(st.st_uid), mode)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > 40:
                return "%s: too many levels of symbolic links" % p
            target = os.readlink(p)
            if target.startswith("/"):
                cur = "/"
            todo += [c for c in reversed(target.split("/")) if c]
            continue
        last = not todo
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and not last
        if st.st_mode & stat.S_IWOTH and not sticky_dir:
            return "%s: writable by every user (mode %04o)" % (p, mode)
        if st.st_mode & stat.S_IWGRP and not sticky_dir:
            return "%s: writable by group %d (mode %04o)" % (p, st.st_gid, mode)
        cur = p
    return None
