"""`nmt serve` on a network: the body limit enforced while reading, large bodies parsed off the event loop, the
queue's room given back by requests that timed out, the API key, CORS, request ids and the access log."""

import asyncio
import itertools
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from nmt_cli.commands.serve import api_key, cors_origins
from nmt_cli.config import ServeConfig
from nmt_cli.errors import ConfigError
from tests.serve.serving import serving
from tests.serve.test_signals import ROOT, wait_ready
from tests.serve.test_signals import test_options_that_cannot_work_are_refused_before_listening as refused

pytest.importorskip("starlette")
pytest.importorskip("httpx")

KEY = "s3cret-key_0123"


def post_chunks(client, chunks, headers=()):
    """POST /translate straight to the app, its body the chunks (an iterator, maybe endless); the answer's status,
    headers and body, and how many chunks the app read."""
    read = 0
    messages = []
    following = next(chunks, None)

    async def receive():
        nonlocal read, following
        if following is None:  # the client waits for its answer
            await asyncio.Event().wait()
        chunk, following = following, next(chunks, None)
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": following is not None}

    async def send(message):
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/translate",
        "raw_path": b"/translate",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    client.portal.call(client.app, scope, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body, read


def test_a_body_over_the_limit_is_refused_without_being_read_whole(tiny_checkpoint):
    with serving(tiny_checkpoint, limits={"max_body_bytes": 1 << 20}) as client:
        # declared too long: refused from its Content-Length, not one byte read
        status, _, body, read = post_chunks(client, iter([b"{}"] * 10), [(b"content-length", str(10**12).encode())])
        assert status == 413 and b"1000000000000 bytes" in body and b"--max-body-bytes" in body and read == 0
        # chunked and endless: cut off just past the limit (64 KiB chunks: 17 of them pass 1 MiB)
        status, headers, body, read = post_chunks(client, itertools.repeat(b" " * (64 << 10)))
        assert status == 413 and b"passes 1,048,576 bytes" in body and read == 17
        assert b"x-request-id" in headers
        # within the limit it is read and answered
        status, _, body, _ = post_chunks(client, iter([b'{"text": ', b'"1 2 3"}']))
        assert status == 200, body
        assert 'nmt_requests_total{code="413"} 2' in client.get("/metrics").text


def test_health_answers_while_a_large_text_is_encoded(tiny_checkpoint):
    """A large body is parsed and encoded on a thread: /health answers throughout. Counted by the answers that came
    within the parse (on the event loop none would, or one), not by the slowest one alone: a pause of the whole
    process (0.46 s against a parse of 0.59 s, seen once in CI) is not the event loop held by the parse."""
    text = " ".join(str(i % 10) for i in range(1_000_000))  # 2 MB of digits: encoding it takes a while
    with serving(tiny_checkpoint, limits={"max_body_bytes": 4 << 20}, max_input_chars=4 << 20) as client:
        server = client.app.state.server
        start = time.perf_counter()
        server.parse(json.dumps({"text": text}).encode())  # what the event loop would be held for
        held = time.perf_counter() - start
        parsing = []  # (start, end) of the request's parse, as the server runs it
        parse = server.parse

        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return parse(*args, **kwargs)
            finally:
                parsing.append((began, time.perf_counter()))

        server.parse = timed
        done = threading.Event()
        answer = {}

        def ask():
            answer["response"] = client.post("/translate", json={"text": text})
            done.set()

        asker = threading.Thread(target=ask)
        asker.start()
        latencies, answered = [], []  # each /health's seconds, and when it was answered
        while not done.is_set():
            start = time.perf_counter()
            assert client.get("/health").status_code == 200
            answered.append(time.perf_counter())
            latencies.append(answered[-1] - start)
            time.sleep(0.005)
        asker.join()
    assert answer["response"].status_code == 200, answer["response"].text
    assert "truncated" in answer["response"].json()["translations"][0]["warning"]
    [(began, ended)] = parsing
    within = sum(began < t < ended for t in answered)
    assert within >= 3 and max(latencies) < held, (held, ended - began, within, latencies)


def test_requests_that_timed_out_give_their_room_back_and_503_says_when_to_retry(tiny_checkpoint):
    with serving(tiny_checkpoint, max_wait=5.0, timeout=0.3, max_queue=3) as client:
        client.post("/translate", json={"texts": ["1", "2", "3"]})  # a batch of 3: the next waits for 3 sentences
        first = client.post("/translate", json={"texts": ["1", "2"]})  # waits for company, gets 504
        full = client.post("/translate", json={"texts": ["1", "2", "3", "4"]})
        second = client.post("/translate", json={"texts": ["1", "2"]})  # the 504's sentences hold no room
    assert first.status_code == 504 and second.status_code == 504, second.text
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert "holds 0 sentences" in full.json()["error"]


def test_the_api_key_guards_the_api_and_leaves_probes_and_the_page_open(tiny_checkpoint, caplog):
    caplog.set_level(logging.INFO)
    with serving(tiny_checkpoint, limits={"api_key": KEY}) as client:
        for path in ("/", "/health", "/ready"):
            assert client.get(path).status_code == 200, path
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic x"}):
            for response in (
                client.post("/translate", json={"text": "1 2"}, headers=headers),
                client.get("/info", headers=headers),
                client.get("/metrics", headers=headers),
            ):
                assert response.status_code == 401, (headers, response.request.url)
                assert response.headers["www-authenticate"] == "Bearer"
                assert "Authorization: Bearer KEY" in response.json()["error"]
        good = {"Authorization": f"Bearer {KEY}"}
        assert client.post("/translate", json={"text": "1 2"}, headers=good).status_code == 200
        assert client.get("/info", headers=good).status_code == 200
        metrics = client.get("/metrics", headers={"Authorization": f"bearer {KEY}"})
    assert metrics.status_code == 200 and 'nmt_requests_total{code="401"} 4' in metrics.text
    assert KEY not in caplog.text


def test_cors_answers_preflight_for_the_listed_origins_only(tiny_checkpoint):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    with serving(tiny_checkpoint, limits={"cors_origins": ("https://app.example",)}) as client:
        allowed = client.options("/translate", headers={"Origin": "https://app.example", **preflight})
        other = client.options("/translate", headers={"Origin": "https://evil.example", **preflight})
        answer = client.post("/translate", json={"text": "1"}, headers={"Origin": "https://app.example"})
        stranger = client.post("/translate", json={"text": "1"}, headers={"Origin": "https://evil.example"})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert answer.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-request-id" in answer.headers["access-control-expose-headers"].lower()
    assert "access-control-allow-origin" not in stranger.headers
    with serving(tiny_checkpoint) as client:  # none by default
        default = client.options("/translate", headers={"Origin": "https://app.example", **preflight})
        plain = client.post("/translate", json={"text": "1"}, headers={"Origin": "https://app.example"})
    assert default.status_code == 405 and "access-control-allow-origin" not in default.headers
    assert "access-control-allow-origin" not in plain.headers


def test_request_ids_are_echoed_and_every_translate_request_logged(tiny_checkpoint, caplog):
    caplog.set_level(logging.INFO, logger="nmt_cli.serve.access")
    with serving(tiny_checkpoint) as client:
        ok = client.post("/translate", json={"texts": ["1 2", "3"]}, headers={"X-Request-ID": "proxy-id-42"})
        bad = client.post("/translate", content=b"{", headers={"X-Request-ID": "proxy-id-43"})
        odd = client.post("/translate", json={"text": "1"}, headers={"X-Request-ID": "has space"})
        long = client.post("/translate", json={"text": "1"}, headers={"X-Request-ID": "x" * 129})
        client.get("/health")
        missing = client.get("/nowhere")
    assert ok.headers["x-request-id"] == "proxy-id-42"
    assert bad.status_code == 400 and bad.json()["request_id"] == bad.headers["x-request-id"] == "proxy-id-43"
    for response in (odd, long, missing):  # an id not printable, or too long, is replaced by a new one
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])
    assert missing.json()["request_id"] == missing.headers["x-request-id"]
    lines = [r.getMessage() for r in caplog.records if r.name == "nmt_cli.serve.access"]
    assert re.fullmatch(r"\S+ POST /translate 200 2 sentences [\d.]+ ms id=proxy-id-42", lines[0]), lines
    assert re.fullmatch(r"\S+ POST /translate 400 0 sentences [\d.]+ ms id=proxy-id-43", lines[1]), lines
    assert re.fullmatch(r"\S+ GET /nowhere 404 [\d.]+ ms id=[0-9a-f]{32}", lines[-1]), lines
    assert not any("/health" in line or "/ready" in line for line in lines)


def test_the_api_key_comes_from_one_place_and_must_fit_a_header(tmp_path, monkeypatch, tiny_checkpoint):
    monkeypatch.delenv("NMT_API_KEY", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    path = str(tiny_checkpoint)
    assert api_key(ServeConfig(path=path)) == (None, "")
    keys, source = api_key(ServeConfig(path=path, api_key_file=str(key_file)))
    assert source == f"--api-key-file {key_file}" and keys.match(KEY).id == "line1" and keys.match("other") is None
    monkeypatch.setenv("NMT_API_KEY", "from-env")
    assert api_key(ServeConfig(path=path)) == ("from-env", "NMT_API_KEY")
    assert api_key(ServeConfig(path=path, api_key="flag")) == ("flag", "--api-key")
    with pytest.raises(ConfigError, match="not both"):
        api_key(ServeConfig(path=path, api_key="flag", api_key_file=str(key_file)))
    with pytest.raises(ConfigError, match="printable ASCII without spaces"):
        api_key(ServeConfig(path=path, api_key="two words"))
    key_file.write_text("\n")
    with pytest.raises(ConfigError, match="holds no key"):
        api_key(ServeConfig(path=path, api_key_file=str(key_file)))
    assert cors_origins("https://a.example, http://b.example:8080/,*") == (
        "https://a.example",
        "http://b.example:8080",
        "*",
    )
    assert cors_origins(None) == ()
    with pytest.raises(ConfigError, match="--cors-origin 'a.example/path' is not an origin"):
        cors_origins("a.example/path")


@pytest.mark.parametrize(
    "options, says",
    [
        (["--cors-origin", "app.example"], "error: --cors-origin 'app.example' is not an origin"),
        (["--api-key", "k", "--api-key-file", __file__], "error: give the API key once"),
    ],
)
def test_a_bad_key_or_origin_is_one_error_line(tiny_checkpoint, options, says):
    refused(tiny_checkpoint, options, says)


def raw_request(port, head, body=b""):
    """Send a raw HTTP request (head without its final blank line) and read the answer's status line and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
    status, _, rest = answer.partition(b"\r\n")
    return status, rest.partition(b"\r\n\r\n")[2]


def test_a_real_server_refuses_long_bodies_unread_and_takes_its_key_from_the_environment(tiny_checkpoint):
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_cli", "serve", "--path", str(tiny_checkpoint), "--port", "0", "--device", "cpu"]
        + ["--threads", "1", "--max-body-bytes", "1000"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NMT_API_KEY": KEY},
    )
    try:
        port = None
        lines = []
        while port is None and (line := proc.stderr.readline()):
            lines.append(line)
            if found := re.search(r"on http://127\.0\.0\.1:(\d+)", line):
                port = int(found.group(1))
        assert port is not None, "".join(lines)
        wait_ready(port)
        auth = f"Authorization: Bearer {KEY}".encode()
        head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
        status, body = raw_request(port, head + b"\r\nContent-Length: 300000000")  # no byte of it sent
        assert status == b"HTTP/1.1 413 Request Entity Too Large" and b"--max-body-bytes" in body, body
        chunk = b"400\r\n" + b" " * 1024 + b"\r\n"  # chunked, 1 KiB at a time: cut off at the second
        status, body = raw_request(port, head + b"\r\nTransfer-Encoding: chunked", chunk * 3)
        assert status.startswith(b"HTTP/1.1 413") and b"passes 1,000 bytes" in body, body
        status, body = raw_request(port, head.replace(auth, b"") + b"\r\nContent-Length: 13", b'{"text": "1"}')
        assert status.startswith(b"HTTP/1.1 401"), body
        status, body = raw_request(port, head + b"\r\nContent-Length: 13", b'{"text": "1"}')
        assert status == b"HTTP/1.1 200 OK", body
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    err = "".join(lines) + proc.stderr.read()
    assert "the key from NMT_API_KEY" in err and KEY not in err and "Traceback" not in err
    assert re.search(r"POST /translate 413 0 sentences [\d.]+ ms id=[0-9a-f]{32}", err), err
