"""The API keys: one (--api-key, NMT_API_KEY), or --api-key-file's, a line each, `KEY [ID] [req-limit=N]
[char-limit-per-minute=N] [req-limit-daily=N]`, read again whenever the file changes (a key added, rotated or
revoked without a restart). The ID (default `lineN`) names the key's client in logs and limits, never the key."""

from __future__ import annotations

import hmac
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path

from nmt_cli.errors import ConfigError
from nmt_cli.serve.limits import RateLimit

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Key:
    id: str
    rate: RateLimit | None = None  # None: the server's limits


class Keys:
    """The keys a client may send as `Authorization: Bearer KEY`, each compared in constant time."""

    def __init__(self, key: str | None = None, *, path: str | None = None) -> None:
        self.path, self.seen = path, None if path is None else changed(path)
        self.keys = read_keys(path) if path is not None else {key: Key("key")} if key is not None else {}

    def match(self, given: str) -> Key | None:
        """The key `given` is (None: none of them), the file read again first where it has changed."""
        self.refresh()
        found = [named for key, named in self.keys.items() if hmac.compare_digest(given.encode(), key.encode())]
        return found[0] if found else None

    def refresh(self) -> None:
        """Read the file again where it has changed (its time, size or inode); a file that no longer reads keeps the
        keys read last, its error logged once."""
        if self.path is None or (seen := changed(self.path)) == self.seen:
            return
        self.seen = seen
        try:
            self.keys = read_keys(self.path)
            logger.info("--api-key-file %s read again: %d key(s)", self.path, len(self.keys))
        except ConfigError as e:
            logger.error("%s; the keys read before are kept", e)


def changed(path: str) -> tuple[int, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


def read_keys(path: str) -> dict[str, Key]:
    """--api-key-file's keys by key; ConfigError naming the file and line for a line that is not one."""
    limits, keys = {f.name.replace("_", "-"): f.name for f in fields(RateLimit)}, {}
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file {path}: cannot read the keys: {e}") from None
    for n, line in enumerate(lines, 1):
        key, *rest = line.split("#", 1)[0].split() or [""]
        named = rest.pop(0) if rest and "=" not in rest[0] else f"line{n}"
        settings = dict(word.partition("=")[::2] for word in rest)
        if key and not (
            key.isascii() and key.isprintable() and all(limits.get(k) and v.isdigit() for k, v in settings.items())
        ):
            raise ConfigError(
                f"--api-key-file {path} line {n}: write KEY [ID] [req-limit=N] [char-limit-per-minute=N] "
                "[req-limit-daily=N], the key printable ASCII"
            )
        if key:
            keys[key] = Key(named, RateLimit(**{limits[k]: int(v) for k, v in settings.items()}) if settings else None)
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key: write one a line")
    return keys
