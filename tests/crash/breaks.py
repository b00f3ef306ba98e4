"""Known breaks of round 6's writers, reintroduced into a patched copy of the function (issue #48, acceptance): the
harness must fail on each. A patch that no longer applies (the code moved) fails loudly: update the patch."""

from __future__ import annotations

import inspect
import re
import textwrap


def patched(fn, edits: list[tuple[str, str]], extra: dict | None = None):
    """A copy of fn (a module-level function or a method) compiled from its source with each (regex, replacement)
    applied once; its globals are fn's module's, plus extra."""
    src = textwrap.dedent(inspect.getsource(fn))
    for pattern, repl in edits:
        src, n = re.subn(pattern, repl, src, count=1, flags=re.M)
        if n != 1:
            raise AssertionError(f"the patch {pattern!r} no longer applies to {fn.__qualname__}: update it")
    scope = dict(fn.__globals__, **(extra or {}))
    exec(compile(src, inspect.getsourcefile(fn) or "<patched>", "exec"), scope)
    return scope[fn.__name__]


def audit_append_without_fsync():
    """remedy.py AuditLog.append without its fsync: a "started" line can be lost while the change it announces stays."""
    from gpudoctor.remedy import AuditLog

    return AuditLog, "append", patched(AuditLog.append, [(r"^(\s*)fs\.fs_fsync\(fd, self\.path\)\n", r"\1pass\n")])


def marker_before_data():
    """model/stage.py apply_stage writing its marker before the copy (the data it vouches for is not there yet)."""
    from gpudoctor.model import stage

    early = ('\\1safe.write_at(dst_fd, probe.MARKER_NAME, json.dumps({"schema": probe.MARKER_SCHEMA, '
             '"boot_id": probe.boot_id(), "files": [{"name": f.name, "size": f.size} for f in plan.files]}) + "\\\\n", '
             '0o644)\n\\1with ThreadPoolExecutor(')
    return stage, "apply_stage", patched(stage.apply_stage, [(r"^(\s*)with ThreadPoolExecutor\(", early)])


def marker_removed_late():
    """model/stage.py apply_stage removing the old marker after the copy, not first (an old marker vouches for a DST
    being rewritten)."""
    from gpudoctor.model import stage

    return stage, "apply_stage", patched(stage.apply_stage, [
        (r"^\s*safe\.unlink_at\(dst_fd, probe\.MARKER_NAME\).*\n", ""),
        (r"^(\s*)copied = total\[0\]\n", r"\1copied = total[0]\n\1safe.unlink_at(dst_fd, probe.MARKER_NAME)\n")])


BREAKS = {"audit append without fsync": audit_append_without_fsync, "marker before data": marker_before_data,
          "marker removed late": marker_removed_late}
