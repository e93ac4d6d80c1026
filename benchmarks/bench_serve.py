"""`nmt serve` under load, next to `nmt generate` on the same sentences, in one run.

The server runs in a child process on loopback (127.0.0.1, a free port). Phase 1: --clients concurrent
clients, each sending one sentence per request in a loop over keep-alive connections, until every
sentence has been sent once or --time-limit passes; throughput and p50/p99 latency. Phase 2: one client,
one sentence at a time (--single sentences): mean latency. Against `nmt generate` (child processes, same
checkpoint, threads, beam): its throughput on all the sentences (its default batches), its time per batch
of --clients sentences (`--batch-size`), and its time per sentence alone (`--batch-size 1`); generate's
figures are its own logged translation time, without loading. Also counts the server's translations that
differ from generate's (batching differs, so a tie broken by float rounding could; expect 0).

Issue 37's targets (2 idle cores, transformer_small on Multi30k, beam 4, 32 clients): throughput >= 80%
of generate's; p99 <= 2x generate's batch of 32; one client: <= 10 ms over generate's sentence alone.
32 clients with one sentence each in flight can fill batches of 32 at most, so the throughput is also given
next to generate's with `--batch-size 32` (its batches of 32 sentences of like length, the server's of
whichever 32 came).
    .venv/bin/python benchmarks/bench_serve.py --path work/multi30k_en_de/average.pt --conditions idle
    .venv/bin/python benchmarks/bench_serve.py --tiny --path CKPT   # a few seconds: does it all run
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import MULTI30K, NMT, RESULTS, ROOT, WORK, machine, run

TINY_SENTENCES = ["1 2 3", "4 5 6 7 8", "9 0", "3 3 1 4", "2 7 1 8 2 8", "5", "6 6 6", "8 1 9 0 2"]


def generate_seconds(path: Path, src: Path, args: argparse.Namespace, *extra: str) -> tuple[float, list[str]]:
    """`nmt generate`'s own translation time (its closing log line) and its output lines."""
    out = WORK / "bench-serve-generate.txt"
    with out.open("w") as stdout:
        stderr, _, _ = run(
            NMT
            + ["generate", "--path", str(path), "--input", str(src), "--device", args.device]
            + ["--threads", str(args.threads), "--beam", str(args.beam), *extra],
            stdout=stdout,
        )
    # seconds from the sentences/s figure: the seconds themselves are printed to 0.1 s, 0.0 for a tiny input
    found = re.search(r"translated (\d+) sentences \(\d+ tokens\) in [\d.]+ s: ([\d.]+) sentences/s", stderr)
    if found is None:
        raise SystemExit(f"no timing line in generate's log:\n{stderr[-2000:]}")
    return int(found.group(1)) / float(found.group(2)), out.read_text().splitlines()


def start_server(path: Path, args: argparse.Namespace) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        NMT
        + ["serve", "--path", str(path), "--port", "0", "--device", args.device, "--threads", str(args.threads)]
        + ["--beam", str(args.beam), "--max-queue", "100000"]
        + ([] if args.max_wait_ms is None else ["--max-wait-ms", str(args.max_wait_ms)]),
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if found := re.search(r"on http://127\.0\.0\.1:(\d+)", line):
            port = int(found.group(1))
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe drained
            while time.monotonic() < deadline:
                if request(port, "GET", "/ready")[0] == 200:
                    return proc, port
                time.sleep(0.05)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("the server did not start")


def request(port: int, method: str, path: str) -> tuple[int, dict]:
    """One request on a connection of its own: (status, JSON answer), or (0, {}) while the server is not up."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    except OSError:
        return 0, {}
    finally:
        conn.close()


class Client:
    """A keep-alive connection that POSTs JSON to /translate and reads the answer, with as little client work
    as can be: the clients share the server's cores (http.client parses every answer's headers with the email
    package)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        self.buffer = b""

    def translate(self, text: str) -> tuple[int, dict]:
        body = json.dumps({"text": text}).encode()
        self.sock.sendall(f"{self.head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        while b"\r\n\r\n" not in self.buffer:
            self.buffer += self.receive()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        while len(self.buffer) < length:
            self.buffer += self.receive()
        answer, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), json.loads(answer)

    def receive(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise SystemExit("the server closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


def load(port: int, sentences: list[str], clients: int, time_limit: float) -> tuple[list[float], dict, float]:
    """`clients` threads send the sentences one per request until all are sent or time runs out."""
    latencies: list[float] = []
    answers: dict[int, str] = {}
    lock = threading.Lock()
    next_index = iter(range(len(sentences)))
    stop_at = time.monotonic() + time_limit

    def client() -> None:
        conn = Client(port)
        while time.monotonic() < stop_at:
            with lock:
                i = next(next_index, None)
            if i is None:
                break
            start = time.perf_counter()
            status, body = conn.translate(sentences[i])
            seconds = time.perf_counter() - start
            if status != 200:
                raise SystemExit(f"the server answered {status}: {body}")
            with lock:
                latencies.append(seconds)
                answers[i] = body["translations"][0]["text"]
        conn.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, answers, time.perf_counter() - start


def metrics(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    return connection.getresponse().read().decode()


def batch_sizes(port: int) -> re.Match | None:
    """The server's batch-size sum and count so far, from /metrics."""
    return re.search(r"nmt_batch_sentences_sum (\S+)\nnmt_batch_sentences_count (\d+)", metrics(port))


def search_seconds(port: int) -> float:
    """The server's time spent searching so far, from /metrics."""
    found = re.search(r"^nmt_batch_seconds_total (\S+)$", metrics(port), re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


def thread_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of a process's main thread (the server's event loop: HTTP, JSON, the
    tokenizer) and of all its threads, from /proc; (nan, nan) where /proc is not there."""
    tick = os.sysconf("SC_CLK_TCK")

    def seconds(stat: Path) -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    try:
        main = seconds(Path(f"/proc/{pid}/task/{pid}/stat"))
        return main, sum(seconds(p) for p in Path(f"/proc/{pid}/task").glob("*/stat"))
    except OSError:
        return float("nan"), float("nan")


def report_json(name: str, rows: list[dict]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=2) + "\n")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", type=Path, required=True, help="Checkpoint (the issue's: transformer_small, Multi30k).")
    ap.add_argument("--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--single", type=int, default=100, help="Sentences sent by the one client of phase 2.")
    ap.add_argument("--time-limit", type=float, default=300.0, help="Seconds per load phase at most.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--max-wait-ms", type=float, default=None, help="The server's --max-wait-ms (default: its own).")
    ap.add_argument("--tiny", action="store_true", help="Digit sentences, 4 clients: a few seconds.")
    ap.add_argument("--conditions", default="", help="How the machine was (idle, under load), for the record.")
    args = ap.parse_args()
    if args.tiny:
        lines, args.clients, args.single, args.time_limit = TINY_SENTENCES * 3, 4, 4, 20.0
    else:
        lines = args.input.read_text(encoding="utf-8").splitlines()[: args.sentences]
    WORK.mkdir(parents=True, exist_ok=True)
    src = WORK / "bench-serve-input.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")

    gen_all, expected = generate_seconds(args.path, src, args)
    gen_batch, _ = generate_seconds(args.path, src, args, "--batch-size", str(args.clients))
    single_src = WORK / "bench-serve-single.txt"
    single_src.write_text("\n".join(lines[: args.single]) + "\n", encoding="utf-8")
    gen_one, _ = generate_seconds(args.path, single_src, args, "--batch-size", "1")
    per_batch = gen_batch / -(-len(lines) // args.clients)

    proc, port = start_server(args.path, args)
    try:
        loop_before, all_before = thread_seconds(proc.pid)
        latencies, answers, seconds = load(port, lines, args.clients, args.time_limit)
        loop_after, all_after = thread_seconds(proc.pid)
        batches = batch_sizes(port)  # phase 1's batches only (the single client's are all of one)
        searched = search_seconds(port)
        single, _, _ = load(port, lines[: args.single], 1, args.time_limit)
        searched = search_seconds(port) - searched
    finally:
        proc.terminate()
        proc.wait(60)
    served = len(latencies)
    row = {
        "sentences": served,
        "clients": args.clients,
        "serve sent/s": round(served / seconds, 1),
        "generate sent/s": round(len(lines) / gen_all, 1),
        "ratio": round(served / seconds / (len(lines) / gen_all), 2),
        f"generate batch of {args.clients} sent/s": round(len(lines) / gen_batch, 1),
        f"ratio to batch of {args.clients}": round(served / seconds / (len(lines) / gen_batch), 2),
        "p50 ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99 ms": round(percentile(latencies, 0.99) * 1000, 1),
        f"generate batch of {args.clients} ms": round(per_batch * 1000, 1),
        "1 client ms": round(sum(single) / max(len(single), 1) * 1000, 1),
        "generate 1 sentence ms": round(gen_one / len(lines[: args.single]) * 1000, 1),
        # one client's latency less the server's own search time for it: what serving adds, measured
        # in one go (generate's sentence alone is timed in another process, a minute apart)
        "1 client added ms": round((sum(single) - searched) / max(len(single), 1) * 1000, 1),
        "mean batch": round(float(batches.group(1)) / max(int(batches.group(2)), 1), 1) if batches else None,
        # the event loop's CPU time per request (phase 1), and its share of all the server's
        "HTTP CPU ms/request": round((loop_after - loop_before) / max(len(latencies), 1) * 1000, 2),
        "HTTP share of CPU %": round(100 * (loop_after - loop_before) / max(all_after - all_before, 1e-9), 1),
        "differ from generate": sum(answers[i] != expected[i] for i in answers),
        "conditions": args.conditions or "not given",
    }
    for key, value in row.items():  # a row of many columns reads better down the page
        print(f"{key:>28}  {value!s:>12}")
    if not args.tiny:
        report_json("serve", [row])


if __name__ == "__main__":
    sys.exit(main())
