"""A text cut into the sentences a model translates (trained on sentences, it translates a paragraph badly) and the
parts kept between them (spacing, line breaks, HTML markup): `cut` gives the parts, `joined` puts the translations
back. Lines are always cut; sentences by sentencex (Wikimedia's rules for some 300 languages, in linear-time
regexes); HTML by the standard library's parser: the text between tags is translated and escaped again, the markup
kept (end tags as `</tag>`), the text of <script> and <style> and comments left alone."""

from __future__ import annotations

import re
from html import escape
from html.parser import HTMLParser

import sentencex

LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
SPACED = re.compile(r"(\s*)(.*?)(\s*)", re.DOTALL)

# parts of a text: [kept, translated, kept, ..., translated, kept], the kept ones at even indices
Parts = list[str]


def cut(text: str, language: str, *, sentences: bool, html: bool = False) -> Parts:
    """`text`'s parts: its lines (and with `sentences`, each line's sentences, in `language`'s rules) without the
    spacing around them, which is kept; with `html`, those of each run of text between tags."""
    if html:
        nodes = TextNodes()
        nodes.feed(text)
        nodes.close()
        parts = [""]
        for i, part in enumerate(nodes.parts):
            extend(parts, cut(part, language, sentences=sentences) if i % 2 else [part])
        return parts
    parts = [""]
    for i, line in enumerate(LINE_BREAK.split(text)):
        for piece in [line] if i % 2 or not sentences else sentencex.segment(language, line):
            lead, words, trail = SPACED.fullmatch(piece).groups()  # type: ignore[union-attr]
            extend(parts, [lead + trail] if i % 2 or not words else [lead, words, trail])
    return parts


def extend(parts: Parts, more: Parts) -> None:
    """Append `more`'s parts to `parts` (both begin and end with kept ones): the kept ones that meet merge."""
    parts[-1] += more[0]
    parts += more[1:]


def joined(parts: Parts, translations: list[str], *, html: bool = False) -> str:
    """The text of `parts` with each translated part replaced by its translation (escaped in HTML)."""
    texts = [escape(t, quote=False) if html else t for t in translations]
    return parts[0] + "".join(t + kept for t, kept in zip(texts, parts[2::2]))


class TextNodes(HTMLParser):
    """An HTML text's parts: the markup kept, the text between tags translated (character references decoded)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: Parts = [""]

    def keep(self, markup: str) -> None:
        self.parts[-1] += markup

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.keep(self.get_starttag_text() or "")

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag: str) -> None:
        self.keep(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if self.cdata_elem or not data.strip():  # <script>, <style>: not text
            self.keep(data)
        else:
            self.parts += [data, ""]

    def handle_comment(self, data: str) -> None:
        self.keep(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.keep(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        self.keep(f"<?{data}>")

    def unknown_decl(self, data: str) -> None:
        self.keep(f"<![{data}]>")
