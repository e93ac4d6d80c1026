"""GET /openapi.json: a hand-written OpenAPI 3.1 description of every route of `nmt serve` (app.py), our
/translate body and LibreTranslate's (libretranslate.py) both. It is open, like /health: it describes the API
and holds nothing of the server's own (the checkpoint, its languages and settings are /info's).
"""

from __future__ import annotations

from typing import Any

from nmt_cli import __version__
from nmt_cli.search.rules import OPTIONS, RuleOption

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"  # `curl -F q=...`


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def obj(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {"type": "object", **({"required": list(required)} if required else {}), "properties": properties}


def answers(ok: dict[str, Any], *errors: int, media: str = JSON) -> dict[str, Any]:
    """A route's responses: `ok` for 200, the Error schema for each of `errors`."""
    out: dict[str, Any] = {"200": {"description": "OK", "content": {media: {"schema": ok}}}}
    for status in errors:
        out[str(status)] = {"description": ERRORS[status], "content": {JSON: {"schema": ref("Error")}}}
    return out


ERRORS = {
    400: "a request the server cannot read, or a field that does not fit (named in the error)",
    401: "the server has an API key and the request does not carry it",
    403: "a LibreTranslate body's api_key is not the server's key",
    413: "the body is over --max-body-bytes",
    429: "the client has --max-client-sentences queued or in progress, or is past a --req-limit (Retry-After)",
    499: "the client closed the connection (counted in /metrics, never received)",
    500: "a failure of the server's own",
    503: "the queue is full, or the server is shutting down or not ready (Retry-After)",
    504: "not done within --timeout",
}


def rule_schema(option: RuleOption) -> dict[str, Any]:
    """A per-sentence decoding rule's field (search/rules.py): its value beside text, a list of them beside texts."""
    one = array(STRING) if option.phrases else STRING
    kind = "a list of strings" if option.phrases else "a string"
    return {"description": f"{option.what}: {kind} beside text, one per text beside texts", "anyOf": [one, array(one)]}


STRING = {"type": "string"}
OBJECT = {"type": "object"}
INFO = (
    "the default model's checkpoint, shape, search settings and caps, and the models served (?model=NAME: that model's)"
)
TEXTS = {"oneOf": [STRING, array(STRING)]}
SEARCH = {
    "type": "object",
    "description": "any of generate's search settings by their field names (beam, nbest, lenpen, sampling, ...)",
    "additionalProperties": True,
}
TRANSLATE = {
    "text": STRING,
    "texts": array(STRING),
    "model": {"type": "string", "description": "a model's name (/info's models) [default: the first]"},
    **{o.name: rule_schema(o) for o in OPTIONS},
}
SCORE = {"type": ["number", "null"]}  # null: none found
TRANSLATION = {"text": STRING, "score": SCORE, "nbest": array(ref("Hypothesis")), "warning": STRING}
LIBRE = {
    "q": TEXTS,
    "source": {"type": "string", "description": 'a model\'s source language, or "auto"'},
    "target": {"type": "string", "description": "a model's target language"},
    "format": {"type": "string", "enum": ["text", "html"]},
    "split_sentences": {"type": "boolean", "default": True},
    "api_key": {"type": "string", "description": "the server's API key, instead of the Bearer header"},
    "alternatives": {"type": "integer", "minimum": 0},
}
SCHEMAS: dict[str, Any] = {
    "Error": obj({"error": STRING, "request_id": STRING}, "error"),
    "TranslateRequest": {
        "allOf": [SEARCH, {**obj(TRANSLATE), "oneOf": [{"required": ["text"]}, {"required": ["texts"]}]}]
    },
    "Hypothesis": obj({"text": STRING, "score": SCORE}),
    "TranslateResponse": obj(
        {"translations": array(obj(TRANSLATION, "text")), "seconds": {"type": "number"}}, "translations", "seconds"
    ),
    "LibreTranslateRequest": {**obj(LIBRE, "q", "source", "target"), "additionalProperties": False},
    "LibreTranslateResponse": obj({"translatedText": TEXTS, "alternatives": {"type": "array"}}, "translatedText"),
    "Language": obj({"code": STRING, "name": STRING, "targets": array(STRING)}),
}
KEYED: list[dict[str, list[str]]] = [{"bearer": []}]
OPEN: list[dict[str, list[str]]] = []


def get(summary: str, ok: dict[str, Any], *errors: int, media: str = JSON, keyed: bool = False) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "security": KEYED if keyed else OPEN,
            "responses": answers(ok, *errors, media=media),
        }
    }


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of `nmt serve`'s routes."""
    libre = ref("LibreTranslateRequest")
    translate = {
        "summary": "translate texts: our body, or LibreTranslate's (it has q), answered in its own shape",
        "security": KEYED,
        "requestBody": {
            "required": True,
            "content": {
                JSON: {"schema": {"oneOf": [ref("TranslateRequest"), libre]}},
                FORM: {"schema": libre},
                MULTIPART: {"schema": libre},
            },
        },
        "responses": answers(
            {"oneOf": [ref("TranslateResponse"), ref("LibreTranslateResponse")]}, 400, 401, 403, 413, 429, 500, 503, 504
        ),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "nmt serve", "version": __version__},
        "paths": {
            "/": get("a page to translate with", {"type": "string"}, media="text/html"),
            "/translate": {"post": translate},
            "/languages": get("LibreTranslate's language list", array(ref("Language"))),
            "/health": get("the server is alive", OBJECT),
            "/ready": get("the model is loaded and warm (503 until then)", OBJECT, 503),
            "/info": get(INFO, OBJECT, 400, 401, keyed=True),
            "/metrics": get("Prometheus text", {"type": "string"}, 401, media="text/plain", keyed=True),
            "/openapi.json": get("this document", OBJECT),
            "/detect": {
                "post": {
                    **translate,
                    "summary": "LibreTranslate's: the served source languages q may be in, likeliest first",
                    "responses": answers(array(OBJECT), 400, 401, 403, 413),
                }
            },
            "/frontend/settings": get("what LibreTranslate's web front end asks of its server", OBJECT),
        },
        "components": {"schemas": SCHEMAS, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
