"""LibreTranslate's API beside ours, so that its client libraries work with `nmt serve` unchanged.

POST /translate  {"q": "..." or ["...", ...], "source", "target", "format": "text" or "html", "api_key"?,
                 "alternatives"?} (JSON, a form or the query string, as LibreTranslate reads them) ->
                 {"translatedText"} (a list of them for a list), with "alternatives" when asked for,
                 "detectedLanguage" for source "auto", and "warning" where a sentence was cut to the model's positions
POST /detect, GET /languages, GET /frontend/settings: as LibreTranslate answers them

A LibreTranslate body (it has "q") is turned into one of ours ({"texts": [...]}, `nbest` for alternatives): each
text cut into its sentences (segments.py), each translated as a text of ours, the translations put back in its
spacing, lines and markup (`Shape`). `source` must be the checkpoint's source language or "auto" (detect.py), and
`target` its target language; a side the checkpoint does not name takes any code. A parser refuses this body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nmt_cli.config import SearchConfig
from nmt_cli.errors import DataError
from nmt_cli.search.rules import OPTIONS
from nmt_cli.serve.access import authorized
from nmt_cli.serve.body import RequestError
from nmt_cli.serve.keys import Keys
from nmt_cli.serve.request import Sentence
from nmt_cli.serve.segments import Parts, cut, joined

FIELDS = ("q", "source", "target", "format", "api_key", "alternatives", "split_sentences")
NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "hi": "Hindi", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese",
}  # fmt: skip


@dataclass(frozen=True)
class Shape:
    """How our answer's translations become the request's: each text's sentences (its parts, segments.cut)
    translated and put back in its text, in LibreTranslate's shape or ours (each text's "sentences" beside it)."""

    parts: tuple[Parts, ...]  # per text of the request
    libre: bool = True
    single: bool = False  # "q" (or "text") is one text, not a list
    alternatives: int = 0
    html: bool = False
    detected: dict[str, Any] | None = None  # source "auto": the language found (Detector.rank)

    def field_of(self, i: int) -> str:
        """Where our i-th text came from: "q", "q[J]", "text" or "texts[J]", and which of its sentences it is."""
        for j, parts in enumerate(self.parts):
            if i < len(parts) // 2:
                name = ("q" if self.libre else "text") if self.single else f"{'q' if self.libre else 'texts'}[{j}]"
                return name + (f" (sentence {i + 1})" if len(parts) > 3 else "")
            i -= len(parts) // 2
        raise IndexError(i)

    def answer(self, translations: list[dict[str, Any]]) -> dict[str, Any]:
        """Our answer's translations (one per sentence) in the request's shape."""
        at, texts, others, warnings, ours = 0, [], [], [], []
        for parts in self.parts:
            mine, at = translations[at : at + len(parts) // 2], at + len(parts) // 2
            texts.append(joined(parts, [t["text"] for t in mine], html=self.html))
            ours.append({"text": texts[-1], "sentences": mine})
            warnings.append("; ".join(t["warning"] for t in mine if "warning" in t) or None)
            hypotheses = [[h["text"] for h in t.get("nbest", [])[1:]] for t in mine]  # each sentence's others
            n = min(map(len, hypotheses), default=0)
            others.append([joined(parts, [h[j] for h in hypotheses], html=self.html) for j in range(n)])
        if not self.libre:
            return {"translations": ours}
        one = (lambda values: values[0]) if self.single else (lambda values: values)
        body: dict[str, Any] = {"translatedText": one(texts)}
        if self.alternatives:
            body["alternatives"] = one(others)
        if self.detected:
            body["detectedLanguage"] = one([self.detected] * len(texts))
        if any(warnings):  # LibreTranslate has none: a sentence cut to the model's positions is said here
            body["warning"] = one(warnings)
        return body


# A /translate body read (Server.parse): its texts encoded, its batcher key (model name, search settings), the
# sentences' lengths, and how its answer is shaped (None: ours, as searched)
Parsed = tuple[list[Sentence], tuple[str, SearchConfig], list[int], Shape | None]


def shaped(shape: Shape | None, answer: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The answer to a /translate request: ours with its seconds, or in LibreTranslate's shape."""
    if shape is None or not shape.libre:
        return {**(shape.answer(answer["translations"]) if shape else answer), "seconds": round(seconds, 4)}
    return shape.answer(answer["translations"])


def is_libretranslate(payload: Any) -> bool:
    """Whether a /translate body is LibreTranslate's (it has "q"; ours has "text" or "texts")."""
    return isinstance(payload, dict) and "q" in payload


def read_body(
    body: bytes, headers: Mapping[str, str] | None, read_json: Callable[[bytes], Any], query: str = ""
) -> Any:
    """The request's fields: JSON by `read_json`, or, as LibreTranslate reads them, the query string's and a form's
    (urlencoded or multipart; none for an empty body, which deep-translator sends); DataError names what is wrong."""
    kind = (headers or {}).get("content-type", "").lower()
    multipart = kind.startswith("multipart/form-data")
    # a "form" whose body is a JSON object is JSON: `curl -d '{...}'` labels its body a form unless told otherwise
    form = kind.startswith("application/x-www-form-urlencoded") and not body.lstrip().startswith(b"{")
    if not (multipart or form) and body.strip():
        return read_json(body)
    pairs = form_pairs(query.encode(), "query string")
    if multipart:
        pairs += multipart_pairs(body, (headers or {})["content-type"])
    elif body:
        pairs += form_pairs(body, "form body")
    fields = collected(pairs)
    if "q" not in fields:
        raise DataError('the form (or query string) has no "q": give the text as "q" (LibreTranslate\'s), or JSON')
    return fields


def read(
    body: bytes,
    headers: Mapping[str, str] | None,
    key: str | Keys | None,
    read_json: Callable[[bytes], Any],
    query: str = "",
) -> tuple[Any, bool]:
    """A /translate or /detect request's fields (`read_body`), and whether it carries the server's API key (always,
    when it has none), in its Authorization header or in a LibreTranslate body's api_key. Without the key, a body
    that cannot be read is answered 401 (payload None), not 400 with the reason; a LibreTranslate body gets
    LibreTranslate's answers (RequestError): 403 for a wrong api_key, 400 without one."""
    if authorized((headers or {}).get("authorization"), key):
        return read_body(body, headers, read_json, query), True
    try:
        payload = read_body(body, headers, read_json, query)
    except Exception:  # read_json's own error or the forms' DataError: what to do is to send the key
        return None, False
    given = payload.get("api_key") if is_libretranslate(payload) else None
    if isinstance(given, str) and authorized(f"Bearer {given}", key):
        return payload, True
    if given is not None:
        raise RequestError(403, "Invalid API key: the api_key is not this server's key")
    if is_libretranslate(payload) and "authorization" not in (headers or {}):
        raise RequestError(400, "Please contact the server operator to get an API key: send it as api_key")
    return payload, False


def form_pairs(text: bytes, what: str) -> list[tuple[str, str]]:
    """A form-encoded body's (or query string's, `what`) (name, value) pairs; DataError names what is wrong."""
    try:
        return parse_qsl(text.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(text), errors="strict")
    except UnicodeDecodeError as e:
        raise DataError(f"the {what} is not valid UTF-8 (byte {e.start})") from None
    except ValueError as e:
        raise DataError(f"the {what} cannot be read: {e}") from None


def multipart_pairs(body: bytes, content_type: str) -> list[tuple[str, str]]:
    """A multipart/form-data body's (name, value) pairs (`curl -F q=...`; files are refused), as `form_pairs`'."""
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
    return pairs


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
    if fields.get("split_sentences") in ("true", "false"):
        fields["split_sentences"] = fields["split_sentences"] == "true"
    return fields


def translate_body(
    payload: Any, info: dict[str, Any], detected: dict[str, Any] | None = None
) -> tuple[Any, Shape | None]:
    """A LibreTranslate body checked against the checkpoint (`info`, ServedModel.info) and turned into ours of its
    sentences, and how its answer is shaped (`detected`: source "auto"'s language, detect.py); DataError names
    the field that does not fit. Ours is left as it is unless it asks for "split_sentences"."""
    if not is_libretranslate(payload):
        return split_ours(payload, info)
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
    text_format = payload.get("format") or "text"
    if text_format not in ("text", "html"):
        raise DataError(f'"format" is {text_format!r}; this server translates "text" or "html"')
    alternatives = payload.get("alternatives", 0)
    if not isinstance(alternatives, int) or isinstance(alternatives, bool) or alternatives < 0:
        raise DataError(f'"alternatives" must be a whole number >= 0, not {alternatives!r}')
    split = payload.get("split_sentences", True)
    if not isinstance(split, bool):
        raise DataError(f'"split_sentences" must be true or false, not {split!r}')
    language = info["source_lang"] or "en" if payload["source"] == "auto" else payload["source"]
    parts = tuple(cut(text, language, sentences=split, html=text_format == "html") for text in texts)
    ours: dict[str, Any] = {"texts": sentences_of(parts, "q")}
    if alternatives:  # as many hypotheses as asked, from a beam at least as wide (the caps bound both)
        ours |= {"nbest": alternatives + 1, "beam": max(alternatives + 1, info["search"]["beam"])}
    return ours, Shape(parts, single=single, alternatives=alternatives, html=text_format == "html", detected=detected)


def split_ours(payload: Any, info: dict[str, Any]) -> tuple[Any, Shape | None]:
    """Our body, its texts cut into sentences where it asks for "split_sentences": true (else as it is)."""
    if not isinstance(payload, dict):
        return payload, None  # request_texts says what it must be
    split = payload.pop("split_sentences", False)
    if not isinstance(split, bool):
        raise DataError(f'"split_sentences" must be true or false, not {split!r}')
    texts = [payload.get("text")] if "text" in payload else payload.get("texts")
    if not split or ("text" in payload) == ("texts" in payload) or not isinstance(texts, list):
        return payload, None  # request_texts says what is wrong with the texts
    if not all(isinstance(text, str) for text in texts):
        return payload, None
    if given := [o.name for o in OPTIONS if o.name in payload]:  # a text's own, not a sentence's
        raise DataError(f"\"split_sentences\" cannot take {given[0]!r}: it is a whole text's, not a sentence's")
    parts = tuple(cut(text, info["source_lang"] or "en", sentences=True) for text in texts)
    ours = {k: v for k, v in payload.items() if k not in ("text", "texts")}
    return {**ours, "texts": sentences_of(parts, "text" if "text" in payload else "texts")}, Shape(
        parts, libre=False, single="text" in payload
    )


def sentences_of(parts: tuple[Parts, ...], field: str) -> list[str]:
    """The sentences to translate of every text's parts; DataError where there are none."""
    sentences = [sentence for text in parts for sentence in text[1::2]]
    if not sentences:
        raise DataError(f'"{field}" holds no text to translate')
    return sentences


def languages_route(infos: list[dict[str, Any]]) -> Callable[[Request], Awaitable[Response]]:
    """GET /languages of a server whose models' ServedModel.info are `infos`: every source language once, with the
    union of its targets (in --path order)."""
    merged: dict[str, dict[str, Any]] = {}
    for info in infos:
        for language in languages(info):
            known = merged.setdefault(language["code"], {**language, "targets": []})
            known["targets"] += [t for t in language["targets"] if t not in known["targets"]]
    return answering(list(merged.values()))


def answering(value: Any) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint that answers `value`, made once, as JSON."""

    async def endpoint(request: Request) -> Response:
        return JSONResponse(value)

    return endpoint


def frontend_settings(infos: list[dict[str, Any]], key_required: bool) -> dict[str, Any]:
    """GET /frontend/settings: what LibreTranslate's web front end asks of its server, LibreTranslate's defaults
    but for the key, the default model's text limit and its target language (no files, no suggestions)."""
    target = next((i["target_lang"] for i in infos if i["task"] == "translation" and i["target_lang"]), "en")
    return {
        "charLimit": infos[0]["max_input_chars"],
        "frontendTimeout": 500,
        "apiKeys": key_required,
        "keyRequired": key_required,
        "suggestions": False,
        "filesTranslation": False,
        "supportedFilesFormat": [],
        "language": {
            "source": {"code": "auto", "name": "Auto Detect"},
            "target": {"code": target, "name": NAMES.get(target, target)},
        },
    }


def languages(info: dict[str, Any]) -> list[dict[str, Any]]:
    """A model's /languages entry: its source language and its target (none for a parser; nothing where the
    checkpoint names no source language)."""
    source, target = info["source_lang"], info["target_lang"]
    if source is None:
        return []
    targets = [target] if target is not None and info["task"] == "translation" else []
    return [{"code": source, "name": NAMES.get(source, source), "targets": targets}]
