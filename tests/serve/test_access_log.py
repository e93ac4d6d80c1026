"""The access log of a real `nmt serve` process holds one line per request, whatever the client sends: a path
whose percent-escapes decode to a line break, a carriage return, a terminal's escape or a NUL, or a forwarded
address with spaces and a C1 line break, is written escaped, so no client forges a line or a field."""

import re
import socket

import pytest

from tests.serve.test_signals import start_server, wait_ready

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

FORGED = "16:00:00 INFO 127.0.0.1 POST /translate 200 FAKE"
ACCESS = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO (\S+) (\S+) (\S+) (\d{3}) (?:\d+ sentences )?[\d.]+ ms id=\S+"
)


def send_raw(port, head):
    """One raw request (its head, without the final blank line); the answer's status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer.partition(b"\r\n")[0]


def test_what_a_client_sends_cannot_forge_or_break_an_access_line(tiny_checkpoint):
    proc, port, lines = start_server(tiny_checkpoint)
    paths = [
        b"/x%0a" + FORGED.replace(" ", "%20").encode(),
        b"/a%0db%1b[2J%1b]0;title%07c%00d",
        b"/e%c2%85f%e2%80%a8g%e2%80%aeh",  # U+0085 and U+2028 (lines to Python's splitlines), U+202E (bidi)
        b"/back%5cx0a",  # a literal backslash stays distinct from an escape
    ]
    try:
        wait_ready(port)
        statuses = [send_raw(port, b"GET " + path + b" HTTP/1.1") for path in paths]
        statuses.append(send_raw(port, b"GET /y HTTP/1.1\r\nX-Forwarded-For: 10.0.0.1 FAKE\xc2\x85x"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    err = "".join(lines) + proc.stderr.read()
    assert all(status.startswith(b"HTTP/1.1 404") for status in statuses), statuses
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202e]", err), repr(err)
    access = [line for line in err.splitlines() if " GET /" in line]
    assert len(access) == len(statuses), access  # one line per request: none forged, none split
    assert all(ACCESS.fullmatch(line) for line in access), access
    assert access[0].split()[5] == r"/x\x0a16:00:00\x20INFO\x20127.0.0.1\x20POST\x20/translate\x20200\x20FAKE"
    assert access[1].split()[5] == r"/a\x0db\x1b[2J\x1b]0;title\x07c\x00d"
    assert access[2].split()[5] == r"/e\x85f\u2028g\u202eh"
    assert access[3].split()[5] == r"/back\\x0a"
    assert FORGED not in err
