"""Click options built from the config dataclasses: one field, one flag of the same name. A field's default, help
and allowed values live in its `flag(...)` metadata (nmt_cli/config/); this module only translates them for click.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any, TypeVar

import click

from nmt_cli.config import InferenceConfig, SearchConfig
from nmt_cli.errors import ConfigError, NmtError
from nmt_cli.files import require_file
from nmt_cli.flags import flag_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library (setup.cfg installs it there)
    import tomli as tomllib

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=InferenceConfig)
CONTEXT = {"show_default": True, "help_option_names": ["-h", "--help"], "max_content_width": 110}


class ExistingPath(click.ParamType):
    """An existing file, directory or either (`kind`), as a path string or a Path where `as_path`. A missing one is
    one `error:` line naming the option or argument, exit 1 (NmtGroup reports it), not click's usage text."""

    def __init__(self, kind: str, as_path: bool = False) -> None:
        self.kind, self.as_path, self.name = kind, as_path, {"any": "path"}.get(kind, kind)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(value)
        what = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name if param else "path"
        if self.kind == "file":
            require_file(path, what)
        elif not path.exists():
            raise NmtError(f"{what} {path} does not exist")
        elif self.kind == "dir" and not path.is_dir():
            raise NmtError(f"{what} {path} is not a directory; give a directory")
        return path if self.as_path else str(value)


EXISTING_FILE = ExistingPath("file", as_path=True)
EXISTING_PATH = ExistingPath("any", as_path=True)
PATH_TYPES = {"file": ExistingPath("file"), "dir": ExistingPath("dir"), "new": click.Path()}


def parse_betas(text: str) -> tuple[float, float]:
    """Parse '0.9,0.98' or '(0.9, 0.98)' without eval."""
    parts = [p for p in text.strip("()[] ").replace(" ", "").split(",") if p]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 2:
        raise ConfigError(f"--adam-betas {text!r} must be two numbers like 0.9,0.98")
    return values[0], values[1]


class Betas(click.ParamType):
    name = "BETA1,BETA2"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value if isinstance(value, tuple) else parse_betas(value)


def click_type(f: Field, hint: Any) -> Any:
    """The click type for a field: its path kind, choices or numeric range, else its Python type."""
    m = f.metadata
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional else hint  # `X | None` -> X
    if m["path"]:
        return PATH_TYPES[m["path"]]
    if m["choices"]:
        return click.Choice(m["choices"])
    if typing.get_origin(base) is tuple:
        return Betas()
    if base in (int, float) and (m["min"] is not None or m["max"] is not None):
        kind = click.IntRange if base is int else click.FloatRange
        return kind(m["min"], m["max"], min_open=m["min_open"], max_open=m["max_open"])
    return base


# Options whose repetition is a mistake to name rather than a value to override: a second --path is no ensemble
# (that is one --path A.pt:B.pt), and click would otherwise keep the last one given, silently.
GIVEN_ONCE = {"path": "generate and serve take an ensemble as one --path A.pt:B.pt"}


def once(ctx: click.Context, param: click.Parameter, values: tuple[Any, ...]) -> Any:
    """A GIVEN_ONCE option's value; a usage error when it is given more than once."""
    if len(values) > 1:
        hint = GIVEN_ONCE.get(param.name or "", "")
        raise click.BadParameter(f"given {len(values)} times; give it once" + (f" ({hint})" if hint else ""))
    return values[0]


def field_param(f: Field, hint: Any, prefix: str, default_note: str | None) -> Callable[[F], F]:
    """One click parameter for a field. default_note: the default is decided later (a preset, a checkpoint)."""
    name = prefix + f.name
    m = f.metadata
    if m["argument"]:
        return click.argument(name, required=f.default is MISSING, type=click_type(f, hint))
    names = [flag_name(name)] + ([m["short"]] if m["short"] else [])
    help_text = m["help"] + (f" [default: {default_note}]" if default_note else "")
    if hint in (bool, "bool"):
        if default_note is None and f.default is False:
            return click.option(*names, name, is_flag=True, default=False, help=help_text)
        spelled = f"{names[0]}/--no-{names[0][2:]}"
        return click.option(spelled, name, default=None if default_note else f.default, help=help_text)
    if default_note is not None:
        return click.option(*names, name, type=click_type(f, hint), default=None, help=help_text)
    if f.default is MISSING:
        if f.name in GIVEN_ONCE:  # repeated, it is refused rather than its last value taken
            return click.option(
                *names, name, type=click_type(f, hint), required=True, multiple=True, callback=once, help=help_text
            )
        return click.option(*names, name, type=click_type(f, hint), required=True, help=help_text)
    # click would read a tuple default as nargs
    default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
    return click.option(*names, name, type=click_type(f, hint), default=default, help=help_text)


def config_options(
    cls: type,
    *,
    prefix: str = "",
    only: Iterable[str] | None = None,
    default_note: Callable[[Field], str] | None = None,
) -> Callable[[F], F]:
    """Decorate a command with an option for every CLI field of `cls` (or the fields in `only`)."""
    hints = typing.get_type_hints(cls)
    wanted = set(only) if only is not None else None
    chosen = [f for f in fields(cls) if f.metadata.get("cli") and (wanted is None or f.name in wanted)]

    def decorate(fn: F) -> F:
        for f in reversed(chosen):  # click lists options in decoration order, bottom up
            note = default_note(f) if default_note else None
            fn = field_param(f, hints[f.name], prefix, note)(fn)
        return fn

    return decorate


def take(cls: type, values: dict[str, Any], prefix: str = "", drop_none: bool = False) -> dict[str, Any]:
    """Pop the values of `cls`'s fields (named prefix + field) out of a command's keyword arguments."""
    taken = {}
    for f in fields(cls):
        if prefix + f.name in values:
            value = values.pop(prefix + f.name)
            if not (drop_none and value is None):
                taken[f.name] = value
    return taken


def read_config(ctx: click.Context, param: click.Parameter, path: Path | None) -> None:
    """--config FILE: a TOML file of `option = value` lines, the defaults of the command's options (click's
    default_map, which the command line and the NMT_<COMMAND>_<OPTION> variables override); NmtError naming the file
    for a file that is not TOML, a table or a key that names no option of the command."""
    if path is None:
        return
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # TOMLDecodeError (it says where), UnicodeDecodeError
        raise NmtError(f"--config {path} is not a TOML file: {e}") from None
    names = {o.lstrip("-").replace("-", "_"): p.name for p in ctx.command.params if p.expose_value for o in p.opts}
    for key, value in values.items():
        if key.replace("-", "_") not in names or isinstance(value, dict):
            raise NmtError(
                f"--config {path}: {key!r} is no option of nmt {ctx.info_name}; write `option = value` lines, each "
                "option as --help names it without its dashes (max-batch-tokens = 8000)"
            )
    ctx.default_map = {**(ctx.default_map or {}), **{names[k.replace("-", "_")]: v for k, v in values.items()}}


def configurable(command: click.Command) -> None:
    """Every option of `command` also from its environment variable NMT_<COMMAND>_<OPTION> (the group's
    auto_envvar_prefix; shown in --help) and from a file: --config."""
    for param in command.params:
        if isinstance(param, click.Option):
            param.show_envvar = True
    config = click.Option(
        ["--config"],
        type=EXISTING_FILE,
        is_eager=True,  # read before the other options, so that its values are their defaults
        expose_value=False,
        callback=read_config,
        show_envvar=True,
        help="TOML file of `option = value` lines (max-batch-tokens = 8000): defaults for this command's options, "
        "which the command line and the environment variables override.",
    )
    command.params.append(config)


def precision_aliases(fn: F) -> F:
    """--bf16 and --fp16: the spellings fairseq users know, as aliases of --precision."""
    fn = click.option("--fp16", is_flag=True, help="Alias of --precision fp16.")(fn)
    return click.option("--bf16", is_flag=True, help="Alias of --precision bf16.")(fn)


def precision_from(values: dict[str, Any]) -> str | None:
    """Fold --bf16/--fp16 into --precision; contradictory spellings are a usage error."""
    chosen = {p for p, on in (("bf16", values.pop("bf16")), ("fp16", values.pop("fp16"))) if on}
    if values.get("precision"):
        chosen.add(values["precision"])
    if len(chosen) > 1:
        raise click.UsageError(f"conflicting precisions: {', '.join(sorted(chosen))}; give one --precision")
    return chosen.pop() if chosen else None


def inference_options(cls: type[InferenceConfig]) -> Callable[[F], F]:
    """The options of a command that translates with a checkpoint (generate, serve): its config's, --bf16 and
    --fp16, and the search's, whose defaults are the checkpoint's settings."""

    def decorate(fn: F) -> F:
        fn = config_options(SearchConfig, default_note=lambda f: f"the checkpoint's, else {f.default}")(fn)
        return config_options(cls)(precision_aliases(fn))

    return decorate


def inference_config(cls: type[C], values: dict[str, Any]) -> tuple[C, dict[str, Any]]:
    """The config of `inference_options`' values, and the search options given (the others stay the checkpoint's)."""
    values["precision"] = precision_from(values)
    search_overrides = take(SearchConfig, values, drop_none=True)
    return cls(**take(cls, values)), search_overrides
