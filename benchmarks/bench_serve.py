#!/usr/bin/env python3
"""Load test of nmt-serve on loopback: sentences/s and latency for 1, 8 and 64 concurrent
clients, against offline nmt-generate on the same model and input.

    python benchmarks/bench_serve.py CHECKPOINT --input test_2016_flickr.en --threads 2 \\
        --json serve.json
    python benchmarks/bench_serve.py --quick          # a random tiny model, a few seconds

Offline: ``nmt-generate CHECKPOINT -i INPUT --threads T`` (defaults otherwise), its own
sentences/s (model loading excluded). Server: ``nmt-serve CHECKPOINT --threads T`` on
127.0.0.1 (any free port); each client is a thread with one keep-alive connection that sends
the next request (``--sentences-per-request`` lines of the input, in order) as soon as it has
its previous answer, until the input is used once or ``--time-limit`` seconds pass. sentences/s
= sentences answered / wall time of the level; latency = per request, from sending to the
whole answer. Every answer is compared with nmt-generate's line ("mismatches" must be 0).
The clients run on the same machine as the server and take some of its CPU.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def offline(ckpt: Path, src: Path, threads: int, extra: list[str]) -> tuple[float, list[str]]:
    """nmt-generate's sentences/s (its own summary: translation only) and its output."""
    r = subprocess.run([sys.executable, "-m", "nmt.cli.generate", str(ckpt), "-i", str(src),
                        "--threads", str(threads), *extra], capture_output=True, text=True,
                       env=ENV, timeout=3600, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"bench_serve: nmt-generate failed: {r.stderr.strip()[-500:]}")
    m = re.search(r"translated \d+ sentences .* ([\d.]+) sentences/s", r.stderr)
    if m is None:
        sys.exit(f"bench_serve: no summary line in nmt-generate's log: {r.stderr[-500:]}")
    return float(m.group(1)), r.stdout.split("\n")[:-1]


class Server:
    """nmt-serve in a subprocess (stderr in a file), stopped with SIGTERM."""

    def __init__(self, ckpt: Path, threads: int, extra: list[str], log: Path):
        self.log = log
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nmt.cli.serve", str(ckpt), "--port", "0", "--threads",
                 str(threads), *extra], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=err, env=ENV)
        self.port = self._wait_ready(time.monotonic() + 300)

    def _wait_ready(self, deadline: float) -> int:
        port = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"bench_serve: nmt-serve exited: {self.log.read_text()[-500:]}")
            if port is None:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log.read_text())
                port = int(m.group(1)) if m else None
            elif call(port, "GET", "/ready")[0] == 200:
                return port
            time.sleep(0.05)
        sys.exit("bench_serve: nmt-serve was not ready in time")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        finally:
            self.proc.kill()


def call(port: int, method: str, path: str, body: dict | None = None,
         conn: http.client.HTTPConnection | None = None) -> tuple[int, dict | None]:
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    except OSError:
        return 0, None
    finally:
        if own:
            conn.close()


def load(port: int, lines: list[str], clients: int, per_request: int,
         time_limit: float) -> dict:
    """``clients`` threads send the input's requests in turn; latencies and answers."""
    starts = list(range(0, len(lines), per_request))
    answers: dict[int, list[str]] = {}
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    next_request = iter(starts)
    deadline = time.monotonic() + time_limit

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            while time.monotonic() < deadline:
                with lock:
                    first = next(next_request, None)
                if first is None:
                    return
                t = time.perf_counter()
                status, out = call(port, "POST", "/translate",
                                   {"text": lines[first:first + per_request]}, conn)
                with lock:
                    if status != 200:
                        failures.append(f"{status} {out}")
                        return
                    latencies.append(time.perf_counter() - t)
                    answers[first] = out["translations"]
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    return {"answers": answers, "latencies": sorted(latencies), "wall": wall,
            "failures": failures}


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def level_row(clients: int, run: dict, want: list[str], offline_rate: float) -> dict:
    done = sum(len(a) for a in run["answers"].values())
    mismatches = sum(got != want[first + i] for first, a in run["answers"].items()
                     for i, got in enumerate(a))
    rate = done / run["wall"]
    lat = run["latencies"]
    return {"clients": clients, "requests": len(lat), "sentences": done,
            "wall_s": round(run["wall"], 3), "sentences_per_s": round(rate, 2),
            "of_offline": round(rate / offline_rate, 3),
            "p50_ms": round(1000 * percentile(lat, 0.50), 1),
            "p99_ms": round(1000 * percentile(lat, 0.99), 1),
            "mismatches": mismatches, "failures": run["failures"][:3]}


def quick_setup(tmp: Path) -> tuple[Path, list[str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_generate import quick_setup as tiny

    ckpts, lines = tiny(tmp)
    return ckpts[0], lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--input", help="raw source sentences, one per line")
    ap.add_argument("--limit", type=int, default=0, help="use the first N lines (0: all)")
    ap.add_argument("--clients", default="1,8,64", help="comma-separated client counts")
    ap.add_argument("--sentences-per-request", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of both sides")
    ap.add_argument("--time-limit", type=float, default=120.0,
                    help="seconds per level: no new request after it")
    ap.add_argument("--serve-args", default="", help="more nmt-serve options, e.g. "
                    "'--max-batch-tokens 4096 --max-wait-ms 5'")
    ap.add_argument("--generate-args", default="", help="more nmt-generate options")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quick", action="store_true",
                    help="a random tiny model, 60 lines, 2 s per level: checks the script works")
    args = ap.parse_args(argv)
    if args.sentences_per_request < 1 or args.time_limit <= 0:
        ap.error("--sentences-per-request and --time-limit must be positive")
    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    if args.quick:
        ckpt, lines = quick_setup(work)
        args.time_limit = min(args.time_limit, 2.0)
    elif args.checkpoint and args.input:
        ckpt = Path(args.checkpoint)
        lines = Path(args.input).read_text(encoding="utf-8").splitlines()
    else:
        ap.error("give CHECKPOINT and --input (or --quick)")
    lines = lines[:args.limit] if args.limit else lines
    src = work / "input.txt"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    levels = [int(c) for c in args.clients.split(",")]

    server = Server(ckpt, args.threads, args.serve_args.split(), work / "serve.log")
    try:
        # The idle server takes no CPU while nmt-generate runs.
        rate, want = offline(ckpt, src, args.threads, args.generate_args.split())
        call(server.port, "POST", "/translate", {"text": lines[:16]})      # warm-up
        rows = [level_row(c, load(server.port, lines, c, args.sentences_per_request,
                                  args.time_limit), want, rate) for c in levels]
    finally:
        code = server.stop()
    report = {"checkpoint": str(ckpt), "input_sentences": len(lines), "threads": args.threads,
              "sentences_per_request": args.sentences_per_request,
              "serve_args": args.serve_args, "offline_sentences_per_s": rate,
              "levels": rows, "server_exit_code": code}
    print(f"offline nmt-generate: {rate:.1f} sentences/s ({len(lines)} sentences, "
          f"{args.threads} threads)")
    print("| clients | sentences/s | of offline | p50 ms | p99 ms | requests | mismatches |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['clients']} | {r['sentences_per_s']:.1f} | {r['of_offline']:.0%} | "
              f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['requests']} | {r['mismatches']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    bad = code != 0 or any(r["mismatches"] or r["failures"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
