"""LibreTranslate's API beside ours, so that its client libraries work with `nmt serve` unchanged.

POST /translate  {"q": "..." or ["...", ...], "source", "target", "format": "text", "api_key"?, "alternatives"?}
                 (JSON, or the same fields as a form, urlencoded or multipart) -> {"translatedText": "..."} or, for a
                 list, a list of them,
                 with "alternatives" (a list of texts per text) when asked for
GET /languages   [{"code", "name", "targets"}]: each model's source language, with the targets of every model from it

A body is LibreTranslate's when it has "q"; it is turned into one of ours ({"texts": [...]}, `nbest` for
alternatives), so both are searched alike. `source` must be the checkpoint's source language or "auto" (the
server does not detect a language: it translates from the one it was trained on, so "auto" reports none), and
`target` its target language; a side the checkpoint does not name takes any code. A text of several lines is
translated line by line and the lines joined with "\n", as LibreTranslate keeps them. Only `format: text`: HTML is
not translated. A parser parses, it does not translate: it refuses LibreTranslate's body and lists its source
language with no targets.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from itertools import accumulate
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nmt_cli.config import SearchConfig
from nmt_cli.errors import DataError
from nmt_cli.serve.access import authorized
from nmt_cli.serve.keys import Keys
from nmt_cli.serve.rules import Sentence

FIELDS = ("q", "source", "target", "format", "api_key", "alternatives")
LINE_BREAK = re.compile(r"\r\n|\r|\n")
NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese",
}  # fmt: skip


@dataclass(frozen=True)
class LibreRequest:
    """What a LibreTranslate body asks of its answer: one text or a list, how many alternatives, and how many lines
    each text had (each line is translated as a text of ours, and the lines joined again)."""

    single: bool
    alternatives: int
    lines: tuple[int, ...] = ()  # per text of "q"; () : one line each

    def field_of(self, i: int) -> str:
        """Where our i-th text came from: "q", or "q[J]" of a list, with its line where "q" held several."""
        counts = self.lines or (1,) * (i + 1)
        j = next(j for j, end in enumerate(accumulate(counts)) if i < end)
        line = f" (line {i - sum(counts[:j]) + 1})" if counts[j] > 1 else ""
        return ("q" if self.single else f"q[{j}]") + line

    def answer(self, translations: list[dict[str, Any]]) -> dict[str, Any]:
        """Our answer's translations in LibreTranslate's shape."""
        texts, others, at = [], [], 0
        for n in self.lines or (1,) * len(translations):
            mine = translations[at : at + n]
            at += n
            texts.append("\n".join(t["text"] for t in mine))
            alternatives = [[h["text"] for h in t.get("nbest", [])[1:]] for t in mine]  # per line
            others.append(["\n".join(line[j] for line in alternatives) for j in range(min(map(len, alternatives)))])
        body: dict[str, Any] = {"translatedText": texts[0] if self.single else texts}
        if self.alternatives:
            body["alternatives"] = others[0] if self.single else others
        return body


# A /translate body read (Server.parse): its texts encoded, its batcher key (model name, search settings), the
# sentences' lengths, and what a LibreTranslate body asks of its answer (None for ours)
Parsed = tuple[list[Sentence], tuple[str, SearchConfig], list[int], LibreRequest | None]


def shaped(libre: LibreRequest | None, answer: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The answer to a /translate request: ours with its seconds, or in LibreTranslate's shape."""
    return libre.answer(answer["translations"]) if libre else {**answer, "seconds": round(seconds, 4)}


def is_libretranslate(payload: Any) -> bool:
    """Whether a /translate body is LibreTranslate's (it has "q"; ours has "text" or "texts")."""
    return isinstance(payload, dict) and "q" in payload


def form_kind(headers: Mapping[str, str] | None, body: bytes) -> str | None:
    """How a request's body is form-encoded (as LibreTranslate's clients and `curl -F` send it): "urlencoded",
    "multipart", or None for JSON. A "form" whose body is a JSON object is JSON: `curl -d '{...}'` labels its body
    a form unless told otherwise."""
    kind = (headers or {}).get("content-type", "").lower()
    if kind.startswith("multipart/form-data"):
        return "multipart"
    if kind.startswith("application/x-www-form-urlencoded") and not body.lstrip().startswith(b"{"):
        return "urlencoded"
    return None


def read_body(body: bytes, headers: Mapping[str, str] | None, read_json: Callable[[bytes], Any]) -> Any:
    """The body's fields: a form's (either kind), else JSON by `read_json`."""
    kind = form_kind(headers, body)
    if kind == "multipart":
        return multipart_fields(body, (headers or {})["content-type"])
    return form_fields(body) if kind == "urlencoded" else read_json(body)


def read(
    body: bytes, headers: Mapping[str, str] | None, key: str | Keys | None, read_json: Callable[[bytes], Any]
) -> tuple[Any, bool]:
    """A /translate body read (a form, or JSON by `read_json`), and whether the request carries the server's API
    key (always, when it has none): in its Authorization header, or in a LibreTranslate body's api_key, where that
    API's clients send it (compared the same way). Without the key in the header, a body that cannot be read is
    answered 401 (payload None), as it was before its body was looked at, not 400 with the reason."""
    if authorized((headers or {}).get("authorization"), key):
        return read_body(body, headers, read_json), True
    try:
        payload = read_body(body, headers, read_json)
    except Exception:  # read_json's own error or the forms' DataError: what to do is to send the key
        return None, False
    given = payload.get("api_key") if is_libretranslate(payload) else None
    return payload, isinstance(given, str) and authorized(f"Bearer {given}", key)


def form_fields(body: bytes) -> dict[str, Any]:
    """A form-encoded body's fields (a repeated "q" is a list of texts); DataError names what is wrong."""
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body), errors="strict")
    except UnicodeDecodeError as e:
        raise DataError(f"the form body is not valid UTF-8 (byte {e.start})") from None
    except ValueError as e:
        raise DataError(f"the form body cannot be read: {e}") from None
    return collected(pairs)


def multipart_fields(body: bytes, content_type: str) -> dict[str, Any]:
    """A multipart/form-data body's fields (`curl -F q=...`; files are refused), as `form_fields`'."""
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise DataError("the multipart form body cannot be read: no parts under its boundary")
    pairs = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or part.get_filename() is not None:
            raise DataError("the multipart form body holds a part that is no named field (or a file)")
        payload = part.get_payload(decode=True)
        try:
            value = payload.decode(part.get_content_charset() or "utf-8") if isinstance(payload, bytes) else ""
            pairs.append((name, value))
        except (UnicodeDecodeError, LookupError):
            raise DataError(f"the form field {name!r} is not valid UTF-8") from None
    return collected(pairs)


def collected(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """A form's (name, value) pairs as fields: a repeated "q" is a list of texts; DataError names what is wrong."""
    fields: dict[str, Any] = {}
    for name, value in pairs:
        if name == "q" and "q" in fields:
            fields["q"] = [*(fields["q"] if isinstance(fields["q"], list) else [fields["q"]]), value]
        elif name in fields:
            raise DataError(f"the form gives {name!r} twice")
        else:
            fields[name] = value
    if fields.get("alternatives", "").isdigit():  # a form has only strings
        fields["alternatives"] = int(fields["alternatives"])
    return fields


def translate_body(payload: Any, info: dict[str, Any]) -> tuple[Any, LibreRequest | None]:
    """A LibreTranslate body checked against the checkpoint (`info`, ServedModel.info) and turned into ours, and
    what it asks of its answer; DataError names the field that does not fit. Any other body is left as it is."""
    if not is_libretranslate(payload):
        return payload, None
    if info["task"] != "translation":
        raise DataError('this server parses; LibreTranslate\'s "q" body translates: send {"texts": [...]} instead')
    unknown = sorted(set(payload) - set(FIELDS))
    if unknown:
        raise DataError(f"unknown field {unknown[0]!r}; LibreTranslate's fields are {', '.join(FIELDS)}")
    q = payload["q"]
    single = isinstance(q, str)
    texts = [q] if single else q
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise DataError('"q" must be a string or a list of strings')
    if not texts:
        raise DataError('"q" is empty; give at least one string')
    for side, allowed in (("source", (info["source_lang"], "auto")), ("target", (info["target_lang"],))):
        given = payload.get(side)
        if not isinstance(given, str):
            raise DataError(f'"{side}" must be a language code ({" or ".join(a for a in allowed if a)})')
        if allowed[0] is not None and given not in allowed:
            raise DataError(
                f'"{side}" is {given!r}; this server translates {info["source_lang"]} to {info["target_lang"]}'
                + (' (source may be "auto")' if side == "source" else "")
            )
    text_format = payload.get("format", "text")
    if text_format != "text":
        raise DataError(f'"format" is {text_format!r}; this server translates "text" only')
    alternatives = payload.get("alternatives", 0)
    if not isinstance(alternatives, int) or isinstance(alternatives, bool) or alternatives < 0:
        raise DataError(f'"alternatives" must be a whole number >= 0, not {alternatives!r}')
    lines = [LINE_BREAK.split(text) for text in texts]  # LibreTranslate translates text of several lines
    ours: dict[str, Any] = {"texts": [line for text in lines for line in text]}
    if alternatives:  # as many hypotheses as asked, from a beam at least as wide (the caps bound both)
        ours |= {"nbest": alternatives + 1, "beam": max(alternatives + 1, info["search"]["beam"])}
    return ours, LibreRequest(single, alternatives, tuple(len(text) for text in lines))


def languages_route(infos: list[dict[str, Any]]) -> Callable[[Request], Awaitable[Response]]:
    """The GET /languages endpoint of a server whose models' ServedModel.info are `infos`: every source language
    once, with the union of its targets (in --path order)."""
    merged: dict[str, dict[str, Any]] = {}
    for info in infos:
        for language in languages(info):
            known = merged.setdefault(language["code"], {**language, "targets": []})
            known["targets"] += [t for t in language["targets"] if t not in known["targets"]]
    listed = list(merged.values())

    async def endpoint(request: Request) -> Response:
        return JSONResponse(listed)

    return endpoint


def languages(info: dict[str, Any]) -> list[dict[str, Any]]:
    """GET /languages: the checkpoint's source language and its target (none for a parser, which does not
    translate; nothing where the checkpoint names no source language)."""
    source, target = info["source_lang"], info["target_lang"]
    if source is None:
        return []
    targets = [target] if target is not None and info["task"] == "translation" else []
    return [{"code": source, "name": NAMES.get(source, source), "targets": targets}]
