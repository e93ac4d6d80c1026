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
whichever 32 came). That comparison runs --rounds times, generate's batches then the clients in turn, each
ratio against the generate run just before it, and reports the median ratio: on a shared or throttled machine
either rate drifts by tens of percent between minutes, and alternating keeps the drift out of the ratio.

--adversary (issues 48 and 67): the server starts with the caps docs/guide.md gives a server of clients it does not
trust (UNTRUSTED_CAPS; its own defaults for the others, each cap and --timeout also an option), and after the
phases above the --clients phase runs again, --rounds times without and with one more client that sends, at once
and every --adversary-every seconds (3; at once where its last request took longer), the most expensive request
the server's caps allow (its /info: every text at --max-input-chars, --max-request-sentences of them, beam and
nbest at their caps, every output forced to the longest length). Each client has an address of its own (sent as
X-Forwarded-For, which the server trusts from loopback), so that the server tells them apart as it tells its
clients apart. Printed: the normal clients' sentences/s (200s) and p50/p99 in both conditions (a 504 counts at its
latency), and the ratios; issue 67's targets: sentences/s with >= 0.7x without, p99 with <= 2x without.
--threads-compare 1,2: the --clients phase on a server of each thread count
(0: serve's default), all with the same settings, in turn round after round. --fixed-slots: the server and every
generate run it is compared with search over fixed slots (`--fixed-slots`, with CUDA graphs on a GPU), so that each
ratio compares one search; the table's `search` says which ran (the server's /info).
    .venv/bin/python benchmarks/bench_serve.py --path work/multi30k_en_de/average.pt --conditions idle
    .venv/bin/python benchmarks/bench_serve.py --path CKPT --adversary --rounds 2 --threads-compare 0,1,2
    .venv/bin/python benchmarks/bench_serve.py --path CKPT --device cuda --fixed-slots
    .venv/bin/python benchmarks/bench_serve.py --tiny --path CKPT   # a few seconds: does it all run
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from common import MULTI30K, NMT, RESULTS, ROOT, WORK, machine, run

TINY_SENTENCES = ["1 2 3", "4 5 6 7 8", "9 0", "3 3 1 4", "2 7 1 8 2 8", "5", "6 6 6", "8 1 9 0 2"]
# The server's caps and --timeout a run may give (each its own option); under --adversary, UNTRUSTED_CAPS unless given:
# docs/guide.md's "A server for clients it does not trust", the server's defaults for the others
CAPS = {"max_beam": int, "max_nbest": int, "max_output_tokens": int, "max_input_chars": int}
CAPS |= {"max_request_sentences": int, "timeout": float}
UNTRUSTED_CAPS = {"max_beam": 8, "max_output_tokens": 256}
ADVERSARY_ADDRESS = "10.1.0.1"


def address(i: int) -> str:
    """The i-th normal client's address (X-Forwarded-For)."""
    return f"10.0.{i // 250}.{i % 250 + 1}"


def generate_seconds(path: Path, src: Path, args: argparse.Namespace, *extra: str) -> tuple[float, list[str]]:
    """`nmt generate`'s own translation time (its closing log line) and its output lines."""
    out = WORK / "bench-serve-generate.txt"
    with out.open("w") as stdout:
        stderr, _, _ = run(
            NMT
            + ["generate", "--path", str(path), "--input", str(src), "--device", args.device]
            + ["--threads", str(args.threads), "--beam", str(args.beam), *search_flags(args), *extra],
            stdout=stdout,
        )
    # seconds from the sentences/s figure: the seconds themselves are printed to 0.1 s, 0.0 for a tiny input
    found = re.search(r"translated (\d+) sentences \(\d+ tokens\) in [\d.]+ s: ([\d.]+) sentences/s", stderr)
    if found is None:
        raise SystemExit(f"no timing line in generate's log:\n{stderr[-2000:]}")
    return int(found.group(1)) / float(found.group(2)), out.read_text().splitlines()


def search_flags(args: argparse.Namespace) -> list[str]:
    """The search flags the server and generate both get: --fixed-slots, or none (the default search)."""
    return ["--fixed-slots"] if args.fixed_slots else []


def search_of(port: int) -> str:
    """Which search the server runs, as its /info says."""
    info = request(port, "GET", "/info")[1]
    if not info.get("fixed_slots"):
        return "default"
    return "fixed slots, CUDA graphs" if info.get("cuda_graphs") else "fixed slots, eager"


def server_caps(args: argparse.Namespace) -> list[str]:
    """The server's caps and timeout given to this run (with --adversary, UNTRUSTED_CAPS at least)."""
    return [
        part
        for name in CAPS
        if getattr(args, name) is not None
        for part in ("--" + name.replace("_", "-"), str(getattr(args, name)))
    ]


def start_server(path: Path, args: argparse.Namespace, threads: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        NMT
        + ["serve", "--path", str(path), "--port", "0", "--device", args.device, "--threads", str(threads)]
        + ["--beam", str(args.beam), "--max-queue", "100000", *search_flags(args), *server_caps(args)]
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

    def __init__(self, port: int, address: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = f"POST /translate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        self.head += f"X-Forwarded-For: {address}\r\n"  # the client the server sees
        self.buffer = b""

    def translate(self, text: str) -> tuple[int, dict]:
        return self.post({"text": text})

    def post(self, payload: dict) -> tuple[int, dict]:
        body = json.dumps(payload).encode()
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


def load(
    port: int, sentences: list[str], clients: int, time_limit: float, failed: Counter | None = None
) -> tuple[list[float], dict, float]:
    """`clients` threads send the sentences one per request until all are sent or time runs out. An answer other
    than 200 stops the run, or, with `failed`, is counted there by status (its latency counted too)."""
    latencies: list[float] = []
    answers: dict[int, str] = {}
    lock = threading.Lock()
    next_index = iter(range(len(sentences)))
    stop_at = time.monotonic() + time_limit

    def client(conn: Client) -> None:
        while time.monotonic() < stop_at:
            with lock:
                i = next(next_index, None)
            if i is None:
                break
            start = time.perf_counter()
            status, body = conn.translate(sentences[i])
            seconds = time.perf_counter() - start
            if status != 200 and failed is None:
                raise SystemExit(f"the server answered {status}: {body}")
            with lock:
                latencies.append(seconds)
                if status == 200:
                    answers[i] = body["translations"][0]["text"]
                else:
                    failed[status] += 1
        conn.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(Client(port, address(i)),)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, answers, time.perf_counter() - start


def adversarial_payload(lines: list[str], info: dict) -> dict:
    """The most expensive request the server's caps allow (its /info): max_request_sentences texts of
    max_input_chars characters (the input's sentences run together, each text starting at another), the widest beam,
    as many hypotheses, and every output forced to the longest length the caps and the model allow (min_len =
    max_len_b, max_len_a 0)."""
    steps = min(info["max_output_tokens"], info["max_positions"] - 1)
    texts = []
    for i in range(info["max_request_sentences"]):
        text, j = "", i
        while len(text) < info["max_input_chars"]:
            text, j = f"{text} {lines[j % len(lines)]}".lstrip(), j + 1
        text = text[: info["max_input_chars"]]
        texts.append(text[:-1] + "." if text.endswith(" ") else text)  # a text does not end in a space
    beam, nbest = info["max_beam"], min(info["max_nbest"], info["max_beam"])  # beam search keeps nbest <= beam
    return {"texts": texts, "beam": beam, "nbest": nbest, "min_len": steps, "max_len_a": 0, "max_len_b": steps}


class Adversary(threading.Thread):
    """One client sending `payload` at once and then every `every` seconds (at once where its previous request took
    longer), one request at a time, until `finish`: each answer's status and seconds."""

    def __init__(self, port: int, payload: dict, every: float) -> None:
        super().__init__(daemon=True)
        self.port, self.payload, self.every = port, payload, every
        self.answers: list[tuple[int, float]] = []
        self.error: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stopping.wait(max(0.0, next_at - time.monotonic())):
            next_at = time.monotonic() + self.every
            conn = Client(self.port, ADVERSARY_ADDRESS)
            start = time.perf_counter()
            try:
                status, body = conn.post(self.payload)
            except SystemExit as e:  # the server closed the connection
                self.error = str(e)
                return
            finally:
                conn.close()
            self.answers.append((status, time.perf_counter() - start))
            if status not in (200, 504):
                self.error = f"the adversary's request got {status}: {body}"
                return

    def finish(self) -> None:
        """Stop sending, and wait for the answer to the request in flight (the next phase starts on an idle server)."""
        self.stopping.set()
        self.join()
        if self.error:
            raise SystemExit(self.error)


def adversary_phases(port: int, lines: list[str], args: argparse.Namespace, expected: list[str]) -> dict:
    """--rounds rounds, each a --clients phase without the adversary and one with it, on one server: the normal
    clients' sentences/s, p50 and p99 in each condition (pooled over the rounds), their ratios, and what the
    adversary got."""
    status, info = request(port, "GET", "/info")
    if status != 200:
        raise SystemExit(f"/info answered {status}: {info}")
    payload = adversarial_payload(lines, info)
    latencies: dict[bool, list[float]] = {False: [], True: []}
    answered, seconds = {False: 0, True: 0}, {False: 0.0, True: 0.0}
    failed: dict[bool, Counter] = {False: Counter(), True: Counter()}
    sent: list[tuple[int, float]] = []
    differ = 0
    for _ in range(args.rounds):
        for with_adversary in (False, True):
            adversary = Adversary(port, payload, args.adversary_every) if with_adversary else None
            if adversary:
                adversary.start()
            try:
                phase, answers, took = load(port, lines, args.clients, args.time_limit, failed[with_adversary])
            finally:
                if adversary:
                    adversary.finish()
                    sent += adversary.answers
            latencies[with_adversary] += phase
            answered[with_adversary] += len(answers)
            seconds[with_adversary] += took
            differ += sum(answers[i] != expected[i] for i in answers)
    row: dict = {
        "adversary request": f"{len(payload['texts'])} texts of {max(map(len, payload['texts']))} chars, beam "
        f"{payload['beam']}, nbest {payload['nbest']}, min_len = max_len_b {payload['min_len']}",
        "adversary every s": args.adversary_every,
        "adversary answers": by_status(Counter(code for code, _ in sent)),
        "adversary mean s": round(sum(t for _, t in sent) / max(len(sent), 1), 2),
    }
    for with_adversary, name in ((False, "without adversary"), (True, "with adversary")):
        row[f"{name} sent/s"] = round(answered[with_adversary] / max(seconds[with_adversary], 1e-9), 1)
        row[f"{name} p50 ms"] = round(percentile(latencies[with_adversary], 0.5) * 1000, 1)
        row[f"{name} p99 ms"] = round(percentile(latencies[with_adversary], 0.99) * 1000, 1)
        row[f"{name} not 200"] = by_status(failed[with_adversary])  # their latency is in the percentiles
    row["sent/s with / without"] = round(row["with adversary sent/s"] / max(row["without adversary sent/s"], 1e-9), 2)
    row["sent/s with / without target"] = ">= 0.7"
    row["p99 with / without"] = round(row["with adversary p99 ms"] / max(row["without adversary p99 ms"], 1e-9), 2)
    row["p99 with / without target"] = "<= 2"
    row["adversary phases differ"] = differ
    return row


def by_status(counts: Counter) -> str:
    """Answers counted by HTTP status: `3 x 200, 1 x 504`, or `none`."""
    return ", ".join(f"{n} x {code}" for code, n in sorted(counts.items())) or "none"


def compare_threads(lines: list[str], args: argparse.Namespace) -> dict:
    """The --clients phase on one server per --threads-compare count (0: serve's default), all started with the
    same settings and loaded in turn, round after round (--rounds): throughput and p50/p99 for each count."""
    servers: dict[int, tuple[subprocess.Popen, int]] = {}
    latencies: dict[int, list[float]] = {n: [] for n in args.threads_compare}
    seconds = dict.fromkeys(args.threads_compare, 0.0)
    try:
        for n in args.threads_compare:
            servers[n] = start_server(args.path, args, n)
        for _ in range(args.rounds):
            for n in args.threads_compare:
                phase, _, took = load(servers[n][1], lines, args.clients, args.time_limit)
                latencies[n] += phase
                seconds[n] += took
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    row = {}
    for n in args.threads_compare:
        row[f"threads {n} sent/s"] = round(len(latencies[n]) / seconds[n], 1)
        row[f"threads {n} p50 ms"] = round(percentile(latencies[n], 0.5) * 1000, 1)
        row[f"threads {n} p99 ms"] = round(percentile(latencies[n], 0.99) * 1000, 1)
    return row


def thread_counts(text: str) -> list[int]:
    """--threads-compare's comma-separated thread counts."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0 or len(set(counts)) < len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct thread counts >= 0, comma-separated (1,2)")
    return counts


def metrics(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/metrics")
    return connection.getresponse().read().decode()


def batch_sizes(port: int) -> tuple[float, int]:
    """The server's batch-size sum and count so far, from /metrics (every model's)."""
    text = metrics(port)
    return metric_sum(text, "nmt_batch_sentences_sum"), int(metric_sum(text, "nmt_batch_sentences_count"))


def search_seconds(port: int) -> float:
    """The server's time spent searching so far, from /metrics (every model's; NaN where it has none)."""
    text = metrics(port)
    return metric_sum(text, "nmt_batch_seconds_total") if "nmt_batch_seconds_total" in text else float("nan")


def metric_sum(text: str, name: str) -> float:
    """The sum of a metric's samples in a Prometheus text, over their labels (a series per served model)."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


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
    ap.add_argument(
        "--fixed-slots",
        action="store_true",
        help="Serve and generate with --fixed-slots (the beam search over fixed slots, CUDA graphs on a GPU).",
    )
    ap.add_argument("--conditions", default="", help="How the machine was (idle, under load), for the record.")
    ap.add_argument(
        "--adversary",
        action="store_true",
        help="Also run the --clients phase without and with one more client that sends the most expensive request "
        "the server's caps allow every --adversary-every seconds; the normal clients' p50/p99 in both, and the ratio.",
    )
    ap.add_argument("--adversary-every", type=float, default=3.0, help="Seconds between the adversary's requests.")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="Rounds of the alternated phases: generate's batches of --clients then the clients (the median ratio), "
        "and --adversary's and --threads-compare's.",
    )
    ap.add_argument(
        "--threads-compare",
        type=thread_counts,
        default=None,
        help="Thread counts (0: serve's default), e.g. 1,2: the --clients phase on a server of each, in turn.",
    )
    for name, kind in CAPS.items():
        untrusted = f"; {UNTRUSTED_CAPS[name]} with --adversary" if name in UNTRUSTED_CAPS else ""
        flag = "--" + name.replace("_", "-")
        ap.add_argument(flag, type=kind, default=None, help=f"The server's {flag} [default: its own{untrusted}].")
    args = ap.parse_args()
    if args.adversary:
        for name, value in UNTRUSTED_CAPS.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    if args.tiny:
        lines, args.clients, args.single, args.time_limit = TINY_SENTENCES * 3, 4, 4, 20.0
        args.adversary_every = min(args.adversary_every, 0.5)
    else:
        lines = args.input.read_text(encoding="utf-8").splitlines()[: args.sentences]
    WORK.mkdir(parents=True, exist_ok=True)
    src = WORK / "bench-serve-input.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")

    gen_all, expected = generate_seconds(args.path, src, args)
    single_src = WORK / "bench-serve-single.txt"
    single_src.write_text("\n".join(lines[: args.single]) + "\n", encoding="utf-8")
    gen_one, _ = generate_seconds(args.path, single_src, args, "--batch-size", "1")

    proc, port = start_server(args.path, args, args.threads)
    try:
        search = search_of(port)
        rounds, latencies, answers, loop_cpu, all_cpu, clients_cpu = [], [], {}, 0.0, 0.0, 0.0
        for _ in range(args.rounds):  # generate's batches of --clients, then the clients, in turn
            gen_batch, _ = generate_seconds(args.path, src, args, "--batch-size", str(args.clients))
            loop_before, all_before = thread_seconds(proc.pid)
            searched = search_seconds(port)
            clients_before = sum(os.times()[:2])
            served, answered, seconds = load(port, lines, args.clients, args.time_limit)
            clients_cpu += sum(os.times()[:2]) - clients_before
            loop_after, all_after = thread_seconds(proc.pid)
            searched = search_seconds(port) - searched
            latencies += served
            answers.update(answered)
            loop_cpu, all_cpu = loop_cpu + loop_after - loop_before, all_cpu + all_after - all_before
            rounds.append((len(served) / seconds, len(lines) / gen_batch, searched / seconds))
        batches = batch_sizes(port)  # the --clients phases' batches only (the single client's are all of one)
        searched = search_seconds(port)
        single, _, _ = load(port, lines[: args.single], 1, args.time_limit)
        searched = search_seconds(port) - searched
        adversary = adversary_phases(port, lines, args, expected) if args.adversary else {}
    finally:
        proc.terminate()
        proc.wait(60)
    serve_rate, gen_rate = statistics.median(r[0] for r in rounds), statistics.median(r[1] for r in rounds)
    per_batch = args.clients / gen_rate
    row = {
        "sentences": len(latencies) // args.rounds,
        "clients": args.clients,
        "serve sent/s": round(serve_rate, 1),
        "generate sent/s": round(len(lines) / gen_all, 1),
        "ratio": round(serve_rate / (len(lines) / gen_all), 2),
        f"generate batch of {args.clients} sent/s": round(gen_rate, 1),
        # each round's serve rate over the generate run just before it; the median of them (--rounds)
        f"ratio to batch of {args.clients}": round(statistics.median(r[0] / r[1] for r in rounds), 2),
        "rounds serve/generate": " ".join(f"{r[0]:.1f}/{r[1]:.1f}" for r in rounds),
        "worker searching %": round(100 * statistics.median(r[2] for r in rounds), 1),
        "p50 ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99 ms": round(percentile(latencies, 0.99) * 1000, 1),
        f"generate batch of {args.clients} ms": round(per_batch * 1000, 1),
        "1 client ms": round(sum(single) / max(len(single), 1) * 1000, 1),
        "generate 1 sentence ms": round(gen_one / len(lines[: args.single]) * 1000, 1),
        # one client's latency less the server's own search time for it: what serving adds, measured
        # in one go (generate's sentence alone is timed in another process, a minute apart)
        "1 client added ms": round((sum(single) - searched) / max(len(single), 1) * 1000, 1),
        "mean batch": round(batches[0] / max(batches[1], 1), 1),
        # the event loop's CPU time per request (phase 1), and its share of all the server's
        "HTTP CPU ms/request": round(loop_cpu / max(len(latencies), 1) * 1000, 2),
        "HTTP share of CPU %": round(100 * loop_cpu / max(all_cpu, 1e-9), 1),
        # the clients' own CPU (this process, on the same cores as the server): a cost generate does not share
        "clients CPU ms/request": round(clients_cpu / max(len(latencies), 1) * 1000, 2),
        "differ from generate": sum(answers[i] != expected[i] for i in answers),
        "conditions": args.conditions or "not given",
        "threads": args.threads,
        "search": search,
        "server caps": " ".join(server_caps(args)) or "its defaults",
        **adversary,
        **(compare_threads(lines, args) if args.threads_compare else {}),
    }
    for key, value in row.items():  # a row of many columns reads better down the page
        print(f"{key:>28}  {value!s:>12}")
    print(f"{'machine':>28}  {json.dumps(machine())}")
    if not args.tiny:
        report_json("serve", [row])


if __name__ == "__main__":
    sys.exit(main())
