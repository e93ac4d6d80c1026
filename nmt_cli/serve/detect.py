"""Which of the served models' source languages a text is in: POST /detect, and LibreTranslate's source "auto".

Ranked as LibreTranslate's /detect ranks (confidence 0 to 100): one source language at 100; else by py3langid's
probabilities among them (it runs offline, in numpy, from a model shipped in its wheel; loaded only where there is
a choice). A source language it does not know ranks last, at 0.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from nmt_cli.errors import DataError
from nmt_cli.serve.libretranslate import is_libretranslate

DETECT_CHARS = 4096  # a text's language is told from its beginning: no client holds the event loop with a long one


class Detector:
    """The served models' source languages, and py3langid's model restricted to them where there are several."""

    def __init__(self, infos: list[dict[str, Any]]) -> None:
        self.infos = [info for info in infos if info["task"] == "translation" and info["source_lang"]]
        self.sources = list(dict.fromkeys(info["source_lang"] for info in self.infos))
        self.identifier = None
        if len(self.sources) > 1:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier

            identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
            known = [source for source in self.sources if source in identifier.labels]
            if known:
                identifier.set_languages(known)
                self.identifier = identifier

    def rank(self, text: str, among: Container[str] | None = None) -> list[dict[str, Any]]:
        """The source languages (those `among`) by how likely `text` is in each, best first."""
        sources = [source for source in self.sources if among is None or source in among]
        scores = dict(self.identifier.rank(text[:DETECT_CHARS])) if self.identifier and len(sources) > 1 else {}
        ranked = sorted(sources, key=lambda source: -scores.get(source, len(sources) == 1))
        return [{"confidence": round(100 * scores.get(s, len(sources) == 1), 1), "language": s} for s in ranked]

    def resolve(self, payload: Any) -> dict[str, Any] | None:
        """A LibreTranslate body's source "auto" made the language its texts are in, among those of the models into
        its target; that language (None where the body names its source or no such model names one)."""
        q = payload.get("q") if is_libretranslate(payload) and payload.get("source") == "auto" else None
        if not isinstance(q, (str, list)):
            return None
        among = {i["source_lang"] for i in self.infos if i["target_lang"] in (payload.get("target"), None)}
        ranked = self.rank(q if isinstance(q, str) else "\n".join(map(str, q)), among)
        if ranked:
            payload["source"] = ranked[0]["language"]
        return ranked[0] if ranked else None

    def detect(self, payload: Any) -> list[dict[str, Any]]:
        """POST /detect's answer to a body read by `read`; DataError where it has no text."""
        q = payload.get("q") if isinstance(payload, dict) else None
        if not q or not isinstance(q, (str, list)) or not all(isinstance(text, str) for text in q):
            raise DataError('"q" must be a text or a list of texts (LibreTranslate\'s /detect)')
        return self.rank(q if isinstance(q, str) else "\n".join(q))
