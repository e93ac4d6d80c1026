"""GET /info of a served model: its languages, task, checkpoint (an average's inputs, an ensemble's members),
shape, vocabulary, search settings, where and how it runs, the server's caps, and nmt's version."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from nmt_cli import __version__
from nmt_cli.checkpoint.saved import SavedModel
from nmt_cli.config import ServeConfig
from nmt_cli.search.translate import Inference
from nmt_cli.serve.caps import Caps


def model_info(inference: Inference, cfg: ServeConfig, caps: Caps) -> dict[str, Any]:
    """/info of the model `inference` opened with `cfg`, capped by `caps`."""
    saved = inference.saved
    return {
        "source_lang": saved.source_lang,
        "target_lang": saved.target_lang,
        "task": "parsing" if saved.is_parser else "translation",
        "checkpoint": ":".join(str(m.path.resolve()) for m in inference.members),
        **updates_of(saved),
        **ensemble_of(inference),
        "model": asdict(saved.config),
        "vocab_size": saved.vocab.n_pieces,
        "max_positions": inference.max_positions,
        "search": asdict(inference.search),
        "device": str(inference.device),
        "precision": inference.precision,
        "quantize": cfg.quantize,
        "fixed_slots": inference.slots is not None,
        "cuda_graphs": inference.slots is not None and inference.slots.cuda_graphs,
        "max_batch_tokens": cfg.max_batch_tokens,
        "max_wait_ms": cfg.max_wait_ms,
        "max_request_sentences": cfg.max_request_sentences,
        "max_beam": caps.max_beam,
        "max_nbest": caps.max_nbest,
        "max_output_tokens": caps.max_output_tokens,
        "max_input_chars": caps.max_input_chars,
        "nmt_version": __version__,
    }


def ensemble_of(inference: Inference) -> dict[str, Any]:
    """/info's `ensemble` (none for one checkpoint): each member's checkpoint, weight, shape and updates."""
    if not inference.others:
        return {}
    members = zip(inference.members, inference.weights)
    return {
        "ensemble": [
            {"checkpoint": str(m.path.resolve()), "weight": w, "model": asdict(m.config), **updates_of(m)}
            for m, w in members
        ]
    }


def updates_of(saved: SavedModel) -> dict[str, Any]:
    """/info's `update`: the checkpoint's; for an average, the newest update averaged (an average records its
    first input's), with the inputs and each one's update (None where an older average did not record them)."""
    if not saved.averaged_from:
        return {"update": saved.update}
    known = [u for u in saved.averaged_updates if u is not None]
    updates = list(saved.averaged_updates) or [None] * len(saved.averaged_from)
    return {
        "update": max(known) if known else None,
        "averaged_from": list(saved.averaged_from),
        "averaged_updates": updates,
    }
