"""The API keys `nmt serve` takes: one (--api-key, NMT_API_KEY), or those of --api-key-file, a line each:
`KEY [ID] [req-limit=N] [char-limit-per-minute=N] [req-limit-daily=N]` (# begins a comment). The file is read
again when it changes (its modification time, size or inode, looked at with each request), so that a key is added,
rotated or revoked without a restart; a file that no longer reads keeps the keys read last, with an error logged.
A key's ID (default: its line, `line3`) names its client in the access log and in the limits over time, never the
key itself; its own limits replace the server's for it."""

from __future__ import annotations

import hmac
import logging
import os
from dataclasses import dataclass, fields

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
        found = None
        for key, named in self.keys.items():
            if hmac.compare_digest(given.encode(), key.encode()):
                found = named
        return found

    def refresh(self) -> None:
        """Read the file again where it has changed since it was read last (or tried: a failure is logged once)."""
        if self.path is None or (seen := changed(self.path)) == self.seen:
            return
        self.seen = seen
        try:
            self.keys = read_keys(self.path)
            logger.info("--api-key-file %s read again: %d key(s)", self.path, len(self.keys))
        except ConfigError as e:
            logger.error("%s; the keys read before are kept", e)


def changed(path: str) -> tuple[int, int, int] | None:
    """What tells a file's versions apart: modification time, size, inode (None: it cannot be read)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


def read_keys(path: str) -> dict[str, Key]:
    """--api-key-file's keys by key; ConfigError naming the file and line for a line that is not one."""
    limits = {f.name.replace("_", "-"): f.name for f in fields(RateLimit)}
    keys = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--api-key-file {path}: cannot read the keys: {e}") from None
    for n, line in enumerate(lines, 1):
        key, *rest = line.split("#", 1)[0].split() or [""]
        named = rest.pop(0) if rest and "=" not in rest[0] else f"line{n}"
        settings = dict(word.partition("=")[::2] for word in rest)
        if not key:
            continue
        if not (key.isascii() and key.isprintable()) or not all(
            k in limits and v.isdigit() for k, v in settings.items()
        ):
            raise ConfigError(
                f"--api-key-file {path} line {n}: write KEY [ID] [req-limit=N] [char-limit-per-minute=N] "
                "[req-limit-daily=N], the key printable ASCII"
            )
        keys[key] = Key(named, RateLimit(**{limits[k]: int(v) for k, v in settings.items()}) if settings else None)
    if not keys:
        raise ConfigError(f"--api-key-file {path} holds no key: write one a line")
    return keys
