"""What one request may ask `nmt serve` for: the server's caps on the beam, the hypotheses per text, the output
length and the text length (--max-beam, --max-nbest, --max-output-tokens, --max-input-chars).

Each bounds what one request costs the worker, which every other request waits for. The server's own settings must
fit them (checked at start, in the CLI's words); a request beyond one gets 400 naming its own field (`beam`, not
`--beam`), as every error about a request's search fields does (`request_terms`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from nmt_cli.config import SearchConfig, ServeConfig
from nmt_cli.errors import DataError
from nmt_cli.search.settings import longest_output

DEFAULT_MAX_BEAM = 16
SEARCH_FLAGS = {"--" + f.name.replace("_", "-"): f.name for f in fields(SearchConfig)}
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class Caps:
    """ServeConfig's caps, and the model's positions (the output length the search allows at most)."""

    max_beam: int
    max_nbest: int
    max_output_tokens: int
    max_input_chars: int
    max_positions: int

    @classmethod
    def of(cls, cfg: ServeConfig, search: SearchConfig, max_positions: int) -> Caps:
        """The caps given, else the defaults: a beam of 16 (or the server's own `search.beam` where larger, as a
        parser's 21), as many hypotheses (or the server's --nbest), and the model's longest output (its positions
        less one)."""
        max_beam = cfg.max_beam or max(DEFAULT_MAX_BEAM, search.beam)
        max_output = cfg.max_output_tokens or max_positions - 1
        max_nbest = cfg.max_nbest or max(max_beam, search.nbest)  # sampling's --nbest may pass its --beam
        return cls(max_beam, max_nbest, max_output, cfg.max_input_chars, max_positions)


def request_terms(message: str) -> str:
    """A search settings error in a request's words: each search option (`--max-len-b`) named by its request field
    (`max_len_b`); other options (the server's own, such as --max-beam) stay as they are."""
    return FLAG.sub(lambda m: SEARCH_FLAGS.get(m.group(0), m.group(0)), message)


def cap_problem(search: SearchConfig, caps: Caps, flag: bool) -> str | None:
    """What in `search` exceeds a cap (named as an option when `flag`, else as a request field); None if nothing."""
    name = (lambda field: "--" + field.replace("_", "-")) if flag else (lambda field: field)
    rows = ("nbest", search.nbest, caps.max_nbest, "--max-nbest")
    for field, value, cap, option in (("beam", search.beam, caps.max_beam, "--max-beam"), rows):
        if value > cap:
            return f"{name(field)} {value} is above this server's limit of {cap} ({option})"
    if search.min_len > caps.max_output_tokens:
        return (
            f"{name('min_len')} {search.min_len} is above this server's limit of {caps.max_output_tokens} output "
            "pieces (--max-output-tokens)"
        )
    shortest = longest_output(search, 1, caps.max_positions)
    if shortest > caps.max_output_tokens:
        return (
            f"{name('max_len_a')} {search.max_len_a:g} and {name('max_len_b')} {search.max_len_b} allow {shortest} "
            f"output pieces for a text of one piece, above this server's limit of {caps.max_output_tokens} "
            "(--max-output-tokens)"
        )
    return None


def check_text_length(name: str, text: str, caps: Caps) -> None:
    """A request's text (its field `name`) must fit --max-input-chars (DataError: HTTP 400)."""
    if len(text) > caps.max_input_chars:
        raise DataError(
            f"{name} has {len(text):,} characters, above this server's limit of {caps.max_input_chars:,} "
            "(--max-input-chars)"
        )


def check_outputs(search: SearchConfig, pieces: Sequence[int], caps: Caps, names: Sequence[str]) -> None:
    """Each text's longest output (a * |x| + b, |x| its pieces as searched) must fit --max-output-tokens; `names`:
    the request's fields for the texts."""
    for name, n in zip(names, pieces):
        if n and (longest := longest_output(search, n, caps.max_positions)) > caps.max_output_tokens:
            raise DataError(
                f"{name} has {n} pieces, for which max_len_a {search.max_len_a:g} and max_len_b "
                f"{search.max_len_b} allow {longest} output pieces, above this server's limit of "
                f"{caps.max_output_tokens} (--max-output-tokens); send a shorter text or smaller max_len_a/max_len_b"
            )
