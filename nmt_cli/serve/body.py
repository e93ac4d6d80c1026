"""A request body read as JSON (strict UTF-8, JSON's own numbers, bounded nesting), RequestError: what the
server answers a request it refuses with (app.py turns it into a JSON error), the body's texts, and its fields that
give one value per text (the per-sentence decoding rules: search/rules.py's OPTIONS)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from nmt_cli.errors import DataError
from nmt_cli.search.rules import OPTIONS

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


def request_rules(payload: dict[str, Any], n_texts: int) -> dict[str, list[Any]]:
    """A /translate body's per-sentence decoding rules (search/rules.py's OPTIONS: `prefix`, a string per text, ""
    for none; `constraints`, a list of target phrases per text), by the fields given."""
    rules = {}
    for option in OPTIONS:
        kind = ("a list of strings", "lists of strings") if option.phrases else ("a string", "strings")
        fits = is_phrase_list if option.phrases else lambda value: isinstance(value, str)
        values = per_text(payload, option.name, n_texts, kind, fits)
        if values is not None:
            rules[option.name] = values
    return rules


def per_text(
    payload: dict[str, Any], name: str, n_texts: int, kind: tuple[str, str], fits: Callable[[Any], bool]
) -> list[Any] | None:
    """A body's field that gives one value per text: the value beside "text", a list of `n_texts` values beside
    "texts" (None without the field); each value must `fit` (`kind`: what it is, one and several). DataError
    names the field."""
    if name not in payload:
        return None
    value = payload[name]
    if "text" in payload:
        if not fits(value):
            raise DataError(f"'{name}' must be {kind[0]} beside 'text', not {json_kind(value)}")
        return [value]
    if not isinstance(value, list) or len(value) != n_texts:
        raise DataError(f"'{name}' must be a list of {n_texts} {kind[1]} beside 'texts', one per text")
    for i, one in enumerate(value):
        if not fits(one):
            raise DataError(f"'{name}'[{i}] must be {kind[0]}, not {json_kind(one)}")
    return value


def is_phrase_list(value: Any) -> bool:
    """A text's phrases: a list of strings."""
    return isinstance(value, list) and all(isinstance(phrase, str) for phrase in value)


def request_texts(payload: Any, max_sentences: int) -> tuple[list[str], dict[str, Any]]:
    """The texts of a /translate body and its other (search) fields."""
    if not isinstance(payload, dict):
        raise RequestError(400, 'the body must be a JSON object: {"text": "..."} or {"texts": ["...", ...]}')
    fields = dict(payload)
    if ("text" in fields) == ("texts" in fields):
        raise RequestError(400, 'give either "text" (one string) or "texts" (a list of strings)')
    if "text" in fields:
        texts = [fields.pop("text")]
        if not isinstance(texts[0], str):
            raise RequestError(400, f'"text" must be a string, not {json_kind(texts[0])}')
    else:
        texts = fields.pop("texts")
        if not isinstance(texts, list):
            raise RequestError(400, f'"texts" must be a list of strings, not {json_kind(texts)}')
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise RequestError(400, f'"texts" must be a list of strings; "texts"[{i}] is {json_kind(text)}')
        if not texts:
            raise RequestError(400, '"texts" is empty; give at least one string')
    if len(texts) > max_sentences:
        raise RequestError(
            400, f"{len(texts)} texts in one request; the server takes {max_sentences} (--max-request-sentences)"
        )
    return texts, fields
