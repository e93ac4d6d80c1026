"""A request body read as JSON (strict UTF-8, JSON's own numbers, bounded nesting), and RequestError: what the
server answers a request it refuses with (app.py turns it into a JSON error)."""

from __future__ import annotations

import json
from typing import Any

MAX_INT_DIGITS = 4300  # Python's default limit on converting a string to an int


class RequestError(Exception):
    """A request the server answers with `status`, {"error": message} and `headers`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def no_constant(name: str) -> Any:
    """json.loads' hook for NaN and Infinity, which Python reads but JSON (RFC 8259) does not have."""
    raise ValueError(f"{name} is not a JSON number")


def json_int(digits: str) -> int:
    """json.loads' hook for integers: one longer than Python converts (4,300 digits) is named as such."""
    if len(digits) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits):,} digits is longer than the server reads ({MAX_INT_DIGITS:,})")
    return int(digits)


def read_json(body: bytes) -> Any:
    """The request body as JSON, decoded as strict UTF-8 (its size was checked as it was read)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the body is not valid UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=no_constant, parse_int=json_int)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"the body is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:  # the decoder recurses once per nested array or object
        raise RequestError(400, "the body nests arrays or objects too deeply to be read") from None
    except ValueError as e:  # NaN or Infinity, or too long an integer (the hooks above)
        raise RequestError(400, f"the body is not valid JSON: {e}") from None


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    kinds = {str: "a string", int: "a number", float: "a number", list: "an array", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)
