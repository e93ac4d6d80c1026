"""The models one `nmt serve` serves (`--path [NAME=]CKPT`, repeated), and which of them a request asks for.

They share one Batcher, whose job key is (model name, search settings) and whose run dispatches to that model's
search (batch_search.py). A model's name is NAME, else SRC-TGT where the checkpoint names its languages, else the
file's stem. A request picks its model: ours by `"model": NAME` (default: the first --path), LibreTranslate's by
its `source` and `target`; an unknown model, or a pair no model translates, is a DataError listing the choices.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nmt_cli.config import SearchConfig, ServeConfig
from nmt_cli.errors import ConfigError, DataError
from nmt_cli.search.ensemble import member_paths
from nmt_cli.serve.batcher import Batcher
from nmt_cli.serve.libretranslate import is_libretranslate
from nmt_cli.serve.queued import Answer
from nmt_cli.serve.served_model import ServedModel
from nmt_cli.steps import Steps

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # a model's name: what a URL's query and JSON carry plainly


@dataclass(frozen=True)
class Model:
    """One served model: its name, the --path that gave it, and the ServedModel."""

    name: str
    spec: str
    served: ServedModel

    @property
    def pair(self) -> str:
        info = self.served.info
        return f"{info['source_lang']}-{info['target_lang']}"

    def summary(self) -> dict[str, Any]:
        """Its line in /info's `models`."""
        info = self.served.info
        return {"name": self.name, **{k: info[k] for k in ("source_lang", "target_lang", "task", "checkpoint")}}


def split_path(spec: str) -> tuple[str | None, str]:
    """A --path value's NAME (None when it gives none) and checkpoint: NAME=CKPT, unless the whole value is an
    existing file (a checkpoint whose file name holds "=")."""
    name, sep, ckpt = spec.partition("=")
    if sep and ckpt and NAME.fullmatch(name) and not Path(spec).exists():
        return name, ckpt
    return None, spec


def default_name(served: ServedModel) -> str:
    """SRC-TGT when the checkpoint names both its languages, else its file's stem (the first of an ensemble's)."""
    source, target = served.info["source_lang"], served.info["target_lang"]
    if source and target:
        return f"{source}-{target}"
    return Path(served.path.split(":")[0]).stem


class Models:
    """The served models in --path order (the first is the default) and the batcher's run over all of them."""

    def __init__(self, models: list[Model]) -> None:
        """Raises ConfigError where two models have one name."""
        assert models, "a server serves at least one model"
        self.models: dict[str, Model] = {}
        for model in models:
            if model.name in self.models:
                raise ConfigError(
                    f"--path {self.models[model.name].spec} and --path {model.spec} both serve a model named "
                    f"{model.name!r}; name one of them: --path OTHER={split_path(model.spec)[1]}"
                )
            self.models[model.name] = model
        self.default = models[0]

    @classmethod
    def open(cls, cfg: ServeConfig, search_overrides: dict[str, Any]) -> Models:
        """Load every model of cfg.path and cfg.more_paths, each as `nmt generate --path CKPT` loads it; --weights
        weighs every ensemble among them. ConfigError: two models have one name, or a checkpoint's own problem."""
        specs = (cfg.path, *cfg.more_paths)
        ensemble = [len(member_paths(split_path(spec)[1])) > 1 for spec in specs]
        if cfg.weights is not None and len(specs) > 1 and not any(ensemble):
            raise ConfigError("--weights weighs an ensemble's checkpoints; no --path here is one (A.pt:B.pt)")
        models: list[Model] = []
        for spec, several in zip(specs, ensemble):
            name, ckpt = split_path(spec)
            weights = cfg.weights if several or len(specs) == 1 else None  # each ensemble's; one model has none
            served = ServedModel(replace(cfg, path=ckpt, more_paths=(), weights=weights), search_overrides)
            models.append(Model(name or default_name(served), spec, served))
        return cls(models)

    @classmethod
    def one(cls, served: ServedModel) -> Models:
        """A registry of one model (a ServedModel built from Python)."""
        return cls([Model(default_name(served), served.path, served)])

    def __iter__(self) -> Iterator[Model]:
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)

    def named_model(self, name: Any) -> Model:
        """The model a request's `model` field names (None: the default); DataError lists the names."""
        if name is None:
            return self.default
        if not isinstance(name, str) or name not in self.models:
            raise DataError(f'"model" is {name!r}; this server serves {", ".join(map(repr, self.models))}')
        return self.models[name]

    def choose(self, payload: Any) -> Model:
        """The model a /translate body asks for; the body loses our `model` field (a search field it is not).
        DataError names what does not fit."""
        if is_libretranslate(payload):
            return self.by_languages(payload.get("source"), payload.get("target"))
        if isinstance(payload, dict) and "model" in payload:
            return self.named_model(payload.pop("model"))
        return self.default

    def by_languages(self, source: Any, target: Any) -> Model:
        """The model of a LibreTranslate body's pair (source "auto": the one source into `target`), the first in
        --path order where several models share the pair. With one model, that model: libretranslate.translate_body
        says what does not fit it, as it does for one checkpoint."""
        if len(self.models) == 1:
            return self.default
        translating = [m for m in self if m.served.info["task"] == "translation"]
        pairs = ", ".join(dict.fromkeys(m.pair for m in translating)) or "none (every model here parses)"
        for side, code in (("source", source), ("target", target)):
            if not isinstance(code, str):
                raise DataError(f'"{side}" must be a language code; this server translates {pairs}')
        chosen = [
            m
            for m in translating
            if m.served.info["target_lang"] == target and source in ("auto", m.served.info["source_lang"])
        ]
        sources = list(dict.fromkeys(m.served.info["source_lang"] for m in chosen))
        if len(sources) == 1:  # one pair: its first model in --path order (ours: `model` names any of them)
            return chosen[0]
        if chosen:
            named = " or ".join(map(repr, sources))
            raise DataError(f'several models translate into {target!r}: give "source" {named}, not "auto"')
        raise DataError(f"no model here translates {source} to {target}; this server translates {pairs}")

    def info(self) -> dict[str, Any]:
        """GET /info: the default model's info, and every model's summary."""
        return {**self.default.served.info, "models": [m.summary() for m in self]}

    def run(
        self, key: Hashable, sentences: list[Any], still_wanted: Callable[[], list[bool]], answer: Answer
    ) -> Steps[list[Any]]:
        """The batcher's run: search a batch with the model and settings of its key, (name, SearchConfig), one
        decoder step per resumption, its sentences answered early where the search can."""
        assert isinstance(key, tuple)
        name, search = key
        return self.models[name].served.searcher.run(search, sentences, still_wanted, answer)

    def warm_up(self) -> None:
        """Build and warm up every model in the worker thread, in --path order; with several, what one fails on is
        a ConfigError naming its --path."""
        for model in self:
            try:
                model.served.warm_up()
            except Exception as e:
                if len(self.models) == 1:
                    raise
                raise ConfigError(
                    f"--path {model.spec}: the model failed to translate a warm-up sentence: {type(e).__name__}: {e}"
                ) from e

    def batcher(self, max_wait: float, max_queue: int) -> Batcher:
        """The one batcher (not started) of every model: its worker searches each batch with its key's model."""
        return Batcher(
            self.run,
            max_tokens=self.default.served.max_tokens,
            max_wait=max_wait,
            max_queue=max_queue,
            worker_context=self.default.served.searcher.worker_context,  # every model's threads are alike
            warm_up=self.warm_up,
            cost=self.cost,
        )

    def cost(self, key: Hashable, pieces: int) -> int:
        """The batcher's cost: the tokens the search of a sentence of `pieces` may take with its key's model."""
        assert isinstance(key, tuple)
        name, search = key
        return self.models[name].served.searcher.cost(search, pieces)


def key_of(model: Model, search: SearchConfig) -> tuple[str, SearchConfig]:
    """A request's batcher key: sentences batch together only with those of its model and search settings."""
    return model.name, search


def model_of(key: Hashable) -> str:
    """The name of the model a batcher key (`key_of`) searches with."""
    assert isinstance(key, tuple)
    return key[0]
