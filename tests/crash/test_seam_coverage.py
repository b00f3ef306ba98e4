"""Every mutating file operation in gpudoctor's code goes through the mutation seam (host/ops.py fs_*, or a Host
write, which is host/ops.py on the target): a raw os.rename/os.replace/os.unlink/open(…, "w")/write_text/… anywhere
else fails here unless it is listed below with the reason it is not a host file gpudoctor keeps (issue #40, item 7)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import gpudoctor

PKG = Path(gpudoctor.__file__).resolve().parent
# gpudoctor.checks and gpudoctor.remedies are checks/ and remedies/ in the checkout, inside the package when installed
ROOTS = [PKG] + [PKG.parent / d for d in ("checks", "remedies") if not (PKG / d).exists() and (PKG.parent / d).exists()]
RAW = re.compile(r"os\.(rename|replace|unlink|remove|rmdir|mkdir|makedirs|chmod|fchmod|chown|fchown|mknod|ftruncate"
                 r"|truncate|write|pwrite|symlink|link|utime)\(|\.write_(text|bytes)\(|mkstemp\(|shutil\.(copy\w*|move"
                 r"|rmtree)\(|Path\([^)]*\)\.(unlink|mkdir|rmdir|touch|chmod)\(|(?<!fs)\.(mkdir|rmdir|touch)\(|"
                 r"open\([^)]*['\"](w|a|wb|ab|r\+|x|w\+)['\"]|os\.open\([^)]*O_(CREAT|WRONLY|RDWR|APPEND)|savefig\(")
SEAM = "host/ops.py"  # the seam itself

# file -> (substring of the line, why it is not a host file gpudoctor keeps)
ALLOWED = {
    "cli.py": [("os.devnull", "/dev/null opened for writing")],
    "host/forked.py": [("os.write(w_st", "a pipe to the parent, not a file")],
    "host/agent_prog.py": [("os.write(1", "the agent's stdout, not a file")],
    "model/stage.py": [("os.pwrite(dfd", "a chunk of the part file: recorded by _Copier.copy as one write"),
                       ("os.utime(self.dfd", "recorded just above (fs_note utime)")],
    "sglang/differential.py": [("d.mkdir(parents=True", "a scratch model directory of the differential tool (mkdtemp)"),
                               ('(d / "config.json").write_text', "its config.json, in that scratch")],
    "sglang/resolver.py": [("with open(smi, \"w\")", "a fake nvidia-smi in the resolver's own mkdtemp scratch"),
                           ("os.chmod(smi, 0o755)", "that fake nvidia-smi made executable")],
    "bench/cell/health.py": [(f'open(out + ".{s}", "w"', "the sampler runs on the target as its own stdlib program; its "
                              "output is one level's scratch (temp + replace)") for s in ("ready", "tmp")]
                            + [('os.replace(out + ".tmp", out)', "the sampler's scratch: temp + replace")],
    "bench/server/launch.py": [("open(self.log_path", "the server's log, appended by the server itself"),
                               ("Path(self.log_path).parent.mkdir", "the log's directory")],
    "bench/server/remote.py": [("open(self.log_path", "a local mirror of the server's log"),
                               ("Path(self.log_path).parent.mkdir", "the mirror's directory")],
    "bench/standin/server.py": [('self.fh = open(path, "a"', "the stand-in inference server's own log"),
                                ('open(args.timing_log, "a"', "the stand-in's timing log"),
                                ("os.close(os.open(path, os.O_RDWR", "the stand-in opens a device node it is told to"),
                                ('open(a.xid_log, "a"', "the stand-in's Xid log (a test's kernel-log stand-in)")],
    "bench/records/report.py": [("plot_dir.mkdir(", "the plots' directory of a report"),
                                ("fig.savefig(plot_dir / name", "plots of a report (report.md and results.csv go "
                                                                "through atomic_write)")],
    "campaign/runner.py": [("self.dir.", "the --out directory itself"),
                                 ("os.rmdir(self.dir)", "the --out directory this run made, empty, when its lock failed"),
                                 ("dest.mkdir", "the --out mirror directory")],
}


def _raw_lines():
    for root in ROOTS:
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root).as_posix() if root == PKG else f"{root.name}/{p.relative_to(root).as_posix()}"
            if rel == SEAM:
                continue
            for n, line in enumerate(p.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if RAW.search(code) and "fs.fs_" not in code:
                    yield rel, n, line.strip()


def test_every_mutation_goes_through_the_seam():
    bad = []
    used = set()
    for rel, n, line in _raw_lines():
        hit = [sub for sub, _ in ALLOWED.get(rel, []) if sub in line]
        used.update((rel, sub) for sub in hit)
        if not hit:
            bad.append(f"{rel}:{n}: {line}")
    assert not bad, "mutating file operations outside host/ops.py's seam:\n" + "\n".join(bad)
    stale = [f"{rel}: {sub!r}" for rel, subs in ALLOWED.items() for sub, _ in subs if (rel, sub) not in used]
    assert not stale, "allow-list entries no raw write matches any more (remove them):\n" + "\n".join(stale)


def test_no_exemption_covers_a_whole_file():
    """An empty (or one-character) substring matches every line: a new raw write in that file would pass unseen."""
    assert all(len(sub) >= 8 for subs in ALLOWED.values() for sub, _ in subs), ALLOWED


def test_the_scan_sees_raw_writes():
    assert RAW.search('os.replace(tmp, path)') and RAW.search('Path(x).write_text("y")')
    assert RAW.search('fd = os.open(p, os.O_WRONLY | os.O_CREAT)') and not RAW.search('fs.fs_rename(a, b)')
    assert os.path.exists(PKG / SEAM)
