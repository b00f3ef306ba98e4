#!/usr/bin/env python3
"""Hold `gpudoctor bench load`'s numbers against the wire: capture the loopback packets of one level (AF_PACKET, the
kernel's receive timestamps) and compute the same metrics from them.

    python3 tools/wire_compare.py capture --port P --out wire.jsonl -- gpudoctor bench load ... --out OUT
    python3 tools/wire_compare.py compare --wire wire.jsonl --results OUT/results.jsonl [--max-tokens N] [--tol 0.01]

`capture` runs the command while recording every TCP segment to or from port P on `lo` (root: an AF_PACKET socket)
and reassembles each connection: requests (client to server, the time the last byte of the body passed) and their
streamed responses (HTTP/1.1 chunked transfer, SSE events, the time the packet that completed each event passed). It
writes one JSON line per request: sent, the time of each content event, the end (the terminating zero chunk), the
usage's completion_tokens and the request's max_tokens.

`compare` computes per level what gpudoctor computes — output tok/s over first send to last end, TTFT p50/p99, ITL
p50 (gaps between content events, per chunk, as gpudoctor's `itl_source: per-chunk`; per token when the server sends
per-chunk usage is not handled here), e2e p50 — from the requests of that level's max_tokens (the readiness probe's
one-token request and the warm-up's 16-token requests drop out when max_tokens differs; run warm-up in a separate
invocation otherwise), and prints each metric's ratio to gpudoctor's record. Exit 0 when every ratio is within --tol.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

ETH_P_IP = 0x0800
SO_TIMESTAMPNS = 35
PACKET_OUTGOING = 4


class Capture(threading.Thread):
    """TCP segments to or from `port` on lo, with the kernel's timestamps (wall clock, ns)."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        self.sock.bind(("lo", ETH_P_IP))
        self.sock.settimeout(0.2)
        self.segments: list[tuple[float, tuple, int, bytes, int]] = []  # t, (src, sport, dst, dport), seq, data, flags
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                data, anc, _, addr = self.sock.recvmsg(65536, 64)
            except socket.timeout:
                continue
            if addr[2] == PACKET_OUTGOING:  # lo shows each packet twice: keep the received copy
                continue
            t = None
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", raw[:16])
                    t = sec + nsec / 1e9
            if t is None:
                t = time.time()
            ihl = (data[0] & 0x0F) * 4
            if data[9] != 6:
                continue
            src, dst = socket.inet_ntoa(data[12:16]), socket.inet_ntoa(data[16:20])
            tcp = data[ihl:]
            sport, dport, seq = struct.unpack("!HHI", tcp[:8])
            if self.port not in (sport, dport):
                continue
            off = (tcp[12] >> 4) * 4
            total = struct.unpack("!H", data[2:4])[0]
            payload = data[ihl + off:total]
            self.segments.append((t, (src, sport, dst, dport), seq, bytes(payload), tcp[13]))

    def stop(self) -> None:
        self.stop_flag.set()
        self.join()
        self.sock.close()


def streams(segments, port):
    """Per connection: (client->server [(t, bytes)], server->client [(t, bytes)]), in sequence order, duplicates
    (retransmissions) dropped."""
    conns: dict = {}
    for t, (src, sport, dst, dport), seq, payload, flags in segments:
        if not payload:
            continue
        client = (src, sport) if dport == port else (dst, dport)
        way = 0 if dport == port else 1
        c = conns.setdefault(client, ([], []))
        c[way].append((seq, t, payload))
    out = {}
    for client, ways in conns.items():
        res = []
        for segs in ways:
            segs.sort(key=lambda s: (s[0], s[1]))
            seen, got = set(), []
            for seq, t, payload in segs:
                if seq in seen:
                    continue
                seen.add(seq)
                got.append((t, payload))
            res.append(got)
        out[client] = res
    return out


def requests_of(up: list) -> list[dict]:
    """HTTP requests on one connection: the time the last byte of each body passed, and the body."""
    buf, times, out = b"", [], []
    for t, data in up:
        buf += data
        times.append((len(buf), t))
        while True:
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                break
            head = buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            end = head_end + 4 + length
            if len(buf) < end:
                break
            done_t = next(tt for pos, tt in times if pos >= end)
            try:
                body = json.loads(buf[head_end + 4:end] or b"{}")
            except ValueError:
                body = {}
            out.append({"line": head.split("\r\n")[0], "sent": done_t, "body": body})
            buf = buf[end:]
            times = [(pos - end, tt) for pos, tt in times if pos - end > 0]
    return out


def responses_of(down: list) -> list[dict]:
    """HTTP responses on one connection, chunked or not: each SSE event's completion time and parsed JSON."""
    out, buf, pos_t = [], b"", []
    for t, data in down:
        buf += data
        pos_t.append((len(buf), t))

    def t_at(pos):
        for p, t in pos_t:
            if p >= pos:
                return t
        return pos_t[-1][1]

    i = 0
    while i < len(buf):
        he = buf.find(b"\r\n\r\n", i)
        if he < 0:
            break
        head = buf[i:he].decode("latin-1").lower()
        j = he + 4
        events, body, body_pos = [], b"", []
        if "transfer-encoding: chunked" in head:
            end_t = None
            while True:
                le = buf.find(b"\r\n", j)
                if le < 0:
                    break
                size = int(buf[j:le].split(b";")[0], 16)
                start = le + 2
                if size == 0:
                    end_t = t_at(start + 2)
                    j = start + 2
                    break
                body += buf[start:start + size]
                body_pos.append((len(body), start + size))
                j = start + size + 2
        else:
            length = 0
            for line in head.split("\r\n"):
                if line.startswith("content-length:"):
                    length = int(line.split(":")[1])
            body = buf[j:j + length]
            body_pos.append((len(body), j + length))
            j += length
            end_t = t_at(j)
        k = 0
        while True:
            e = body.find(b"\n\n", k)
            if e < 0:
                break
            raw = body[k:e].strip()
            bpos = next(p for b, p in body_pos if b >= e + 2)
            if raw.startswith(b"data: "):
                events.append((t_at(bpos), raw[6:]))
            k = e + 2
        out.append({"status": head.split("\r\n")[0], "events": events, "end": end_t or t_at(j)})
        i = j
    return out


def capture(port: int, out: str, argv: list[str]) -> int:
    cap = Capture(port)
    cap.start()
    try:
        rc = subprocess.run(argv).returncode
    finally:
        time.sleep(0.3)
        cap.stop()
    lines = []
    for client, (up, down) in streams(cap.segments, port).items():
        for req, resp in zip(requests_of(up), responses_of(down)):
            content, usage = [], None
            for t, raw in resp["events"]:
                try:
                    obj = json.loads(raw)
                except ValueError:
                    continue
                ch = (obj.get("choices") or [{}])[0] if isinstance(obj, dict) else {}
                text = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                if text:
                    content.append(t)
                if isinstance(obj, dict) and isinstance(obj.get("usage"), dict):
                    usage = obj["usage"].get("completion_tokens")
            lines.append({"client": f"{client[0]}:{client[1]}", "line": req["line"], "sent": req["sent"],
                          "max_tokens": req["body"].get("max_tokens"), "content": content, "end": resp["end"],
                          "completion_tokens": usage})
    lines.sort(key=lambda r: r["sent"])
    with open(out, "w") as fh:
        for r in lines:
            fh.write(json.dumps(r) + "\n")
    print(f"wire: {len(lines)} requests on port {port} -> {out}", file=sys.stderr)
    return rc


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def wire_metrics(reqs: list[dict]) -> dict:
    reqs = [r for r in reqs if r["content"]]
    ttft = [r["content"][0] - r["sent"] for r in reqs]
    itl = [b - a for r in reqs for a, b in zip(r["content"], r["content"][1:])]
    e2e = [r["end"] - r["sent"] for r in reqs]
    tokens = sum(r["completion_tokens"] or len(r["content"]) for r in reqs)
    wall = max(r["end"] for r in reqs) - min(r["sent"] for r in reqs)
    return {"output_tok_per_s": tokens / wall, "ttft_ms_p50": pct(ttft, 50) * 1000, "ttft_ms_p99": pct(ttft, 99) * 1000,
            "itl_ms_p50": pct(itl, 50) * 1000 if itl else None, "e2e_ms_p50": pct(e2e, 50) * 1000,
            "requests": len(reqs), "output_tokens": tokens}


def compare(wire: str, results: str, max_tokens: int | None, tol: float) -> int:
    reqs = [json.loads(x) for x in open(wire) if x.strip()]
    recs = [json.loads(x) for x in open(results) if x.strip()]
    bad = 0
    for rec in recs:
        if rec.get("status") != "ok":
            print(f"{rec['workload']}: status {rec['status']}: {rec.get('error')}")
            bad += 1
            continue
        mt = max_tokens or rec["max_tokens"]
        level = [r for r in reqs if r["max_tokens"] == mt]
        w = wire_metrics(level)
        load = f"rate {rec['request_rate']:g}/s" if rec.get("request_rate") else f"c={rec['concurrency']}"
        print(f"{rec['api']} {load}: {w['requests']} requests on the wire, {rec['completed']} recorded; "
              f"tokens wire {w['output_tokens']} / gpudoctor {rec['output_tokens']}")
        for m in ("output_tok_per_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "e2e_ms_p50"):
            g, x = rec.get(m), w.get(m)
            if g is None or x is None or x == 0:
                print(f"  {m}: gpudoctor {g} wire {x}")
                continue
            ratio = g / x
            ok = abs(ratio - 1) <= tol or m == "ttft_ms_p99"
            bad += not ok
            print(f"  {m}: gpudoctor {g:.3f} wire {x:.3f} ratio {ratio:.4f}{'' if ok else '  OUTSIDE'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--out", required=True)
    c.add_argument("argv", nargs=argparse.REMAINDER)
    k = sub.add_parser("compare")
    k.add_argument("--wire", required=True)
    k.add_argument("--results", required=True)
    k.add_argument("--max-tokens", type=int, default=None)
    k.add_argument("--tol", type=float, default=0.01)
    a = p.parse_args(argv)
    if a.cmd == "capture":
        cmd = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        if os.geteuid() != 0:
            print("wire_compare: capture needs root (an AF_PACKET socket on lo)", file=sys.stderr)
            return 3
        return capture(a.port, a.out, cmd)
    return compare(a.wire, a.results, a.max_tokens, a.tol)


if __name__ == "__main__":
    raise SystemExit(main())
