"""`nmt serve` as a process on loopback: a client that disconnects does not hurt the others, and SIGTERM
stops accepting, finishes the queued work, and exits 0."""

import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]


def start_server(ckpt, *extra):
    """The server process and its port, read from its 'serving ... on http://127.0.0.1:PORT' line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "serve", "--path", str(ckpt), "--port", "0", "--device", "cpu"]
        + ["--threads", "1", *extra],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if found := re.search(r"on http://127\.0\.0\.1:(\d+)", line):
            return proc, int(found.group(1)), lines
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail("the server did not start: " + "".join(lines))


def post(port, body, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/translate", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def wait_ready(port, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    pytest.fail("the server did not get ready")


def test_a_disconnecting_client_and_sigterm_with_queued_work(tiny_checkpoint):
    proc, port, _ = start_server(tiny_checkpoint, "--max-wait-ms", "400")
    try:
        wait_ready(port)
        # a client sends a request and goes away before the answer
        body = json.dumps({"texts": ["1 2 3"] * 20}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            s.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert post(port, {"text": "4 5"})[0] == 200
        # a request is queued (waiting 400 ms for company) when SIGTERM comes: it is still answered
        answer = {}
        asker = threading.Thread(
            target=lambda: answer.update(zip(("status", "body"), post(port, {"texts": ["7 8", "9"]})))
        )
        asker.start()
        time.sleep(0.15)
        proc.send_signal(signal.SIGTERM)
        asker.join(30)
        assert proc.wait(timeout=30) == 0
        assert answer["status"] == 200 and len(answer["body"]["translations"]) == 2
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        err = proc.stderr.read()
        assert "Traceback" not in err and "stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
