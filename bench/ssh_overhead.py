"""What one reused SSH connection and its probe agent buy: per-operation latency against a real sshd on 127.0.0.1.

    python bench/ssh_overhead.py [N]

Prints medians and the ratios measured in this one run (no fixed targets: the machine decides the absolutes).
Needs /usr/sbin/sshd and ssh-keygen (as the tests do).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests.*; gpudoctor itself: the installed package

from tests.sshd import start_sshd  # noqa: E402


def median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main(n: int = 30) -> None:
    server = start_sshd(Path(tempfile.mkdtemp(prefix="gpudoctor-bench-")) / "sshd")  # SHLVL=1: no ~/.bashrc
    try:
        host = server.make_host()  # through the probe agent
        classic = server.make_host(agent=False)  # a login shell per command, SFTP for files
        for h in (host, classic):
            h.run(["true"])
        reused = median_ms(lambda: host.run(["true"]), n)
        reused_classic = median_ms(lambda: classic.run(["true"]), n)

        def fresh(**kw):
            h = server.make_host(**kw)
            h.run(["true"])
            h.close()

        fresh_ms = median_ms(fresh, max(5, n // 3))
        fresh_classic = median_ms(lambda: fresh(agent=False), max(5, n // 3))
        d = Path(tempfile.mkdtemp(prefix="gpudoctor-bench-files-"))
        (d / "f").write_bytes(b"x" * 4096)
        paths = [str(d / f"n{i}") for i in range(100)]
        agent_read = median_ms(lambda: host.read_file(str(d / "f")), n)
        sftp_read = median_ms(lambda: classic.read_file(str(d / "f")), n)
        py_read = median_ms(lambda: type(classic).__mro__[1].read_file(classic, str(d / "f")), n)
        batch = median_ms(lambda: host.stat_many(paths), max(5, n // 3))
        single = median_ms(lambda: [host.stat(p) for p in paths[:10]], 3) * 10
        reads = [("read", str(d / "f"))] * 13
        batched_reads = median_ms(lambda: host.batch(reads), n)
        one_by_one = median_ms(lambda: [host.read_file(str(d / "f")) for _ in reads], max(5, n // 3))

        results = []

        def worker():
            for _ in range(10):
                host.run(["true"])
                results.append(1)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        parallel_s = time.perf_counter() - t0
        serial_s = reused * len(results) / 1000
        host.close()
        classic.close()

        print("(the test sshd sets SHLVL=1, so bash skips ~/.bashrc: a login shell here is cheaper than on most hosts)")
        print(f"command through the agent                {reused:8.1f} ms")
        print(f"command through a login shell            {reused_classic:8.1f} ms   ratio {reused_classic / reused:5.1f}x")
        print(f"connect + agent + command + close        {fresh_ms:8.1f} ms   ratio {fresh_ms / reused:5.1f}x")
        print(f"connect + command + close (classic)      {fresh_classic:8.1f} ms")
        print(f"read_file through the agent              {agent_read:8.1f} ms")
        print(f"read_file over SFTP (classic)            {sftp_read:8.1f} ms   ratio {sftp_read / agent_read:5.1f}x")
        print(f"read_file through a python program       {py_read:8.1f} ms   ratio {py_read / agent_read:5.1f}x")
        print(f"13 reads in one batch                    {batched_reads:8.1f} ms")
        print(f"13 reads one by one                      {one_by_one:8.1f} ms   ratio {one_by_one / batched_reads:5.1f}x")
        print(f"stat of 100 paths in one request         {batch:8.1f} ms")
        print(f"stat of 100 paths one by one             {single:8.1f} ms   ratio {single / batch:5.1f}x")
        print(f"160 commands from 16 threads             {parallel_s * 1000:8.1f} ms   "
              f"ratio {serial_s / parallel_s:5.1f}x faster than one after another")
    finally:
        server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
