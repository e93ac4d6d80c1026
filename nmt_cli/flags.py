"""Config fields that are CLI flags: `flag(...)` writes a field's default, help and allowed values once, as the
field's metadata (config/'s dataclasses use it; cli/options.py builds click options from it), and
`check_fields` checks the same bounds when a config is built from Python."""

from __future__ import annotations

import math
from dataclasses import MISSING, field, fields
from typing import Any

from nmt_cli.errors import ConfigError


def flag(
    default: Any = MISSING,
    help: str = "",
    *,
    min: float | None = None,
    max: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
    choices: tuple[str, ...] | None = None,
    path: str | None = None,
    argument: bool = False,
    short: str | None = None,
    cli: bool = True,
) -> Any:
    """A config field that is also a CLI flag: default, help and allowed values in one place.

    path: "file" / "dir" (must exist) or "new" (a path to be written) for the CLI's path checks;
    argument: a positional argument instead of an option; cli=False: set by the program, not a flag.
    """
    meta = {k: v for k, v in locals().items() if k != "default"}  # every argument but the default, by name
    return field(default=default, metadata=meta)


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_fields(cfg: Any) -> None:
    """Raise ConfigError when a field's value breaks the bounds or choices the field declares."""
    for f in fields(cfg):
        value, m, name = getattr(cfg, f.name), f.metadata, flag_name(f.name)
        if value is None or isinstance(value, bool):
            continue
        if m.get("choices") and value not in m["choices"]:
            raise ConfigError(f"{name} {value!r} must be one of {', '.join(m['choices'])}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} {value} must be a finite number")
        low, high = m.get("min"), m.get("max")
        if low is not None and (value <= low if m["min_open"] else value < low):
            raise ConfigError(f"{name} {value} must be {'above' if m['min_open'] else 'at least'} {low:g}")
        if high is not None and (value >= high if m["max_open"] else value > high):
            raise ConfigError(f"{name} {value} must be {'below' if m['max_open'] else 'at most'} {high:g}")


def changed_flags(cfg: Any) -> list[str]:
    """The flags of a config dataclass that differ from their defaults (given, or set to another value)."""
    return [flag_name(f.name) for f in fields(cfg) if f.default is not MISSING and getattr(cfg, f.name) != f.default]


def named_values(option: str, text: str | None, named: bool = True) -> dict[str, str]:
    """`A=1,B=2` as {"A": "1", "B": "2"} (named=False: `A,B` as {"A": "A", "B": "B"}); ConfigError naming the
    option for an empty or repeated name or a missing value."""
    values: dict[str, str] = {}
    for item in text.split(",") if text is not None else []:
        name, equals, value = item.partition("=") if named else (item, "", item)
        if not name.strip() or (named and not (equals and value)) or name in values or name != name.strip():
            form = "NAME=VALUE,NAME=VALUE" if named else "comma-separated names without spaces"
            raise ConfigError(f"{option} {text!r}: {item!r} is empty, repeated or not {form}")
        values[name] = value
    return values
