"""--api-key-file's keys (serve/keys.py): a line each with its id and own limits, read again when the file changes,
the keys read last kept when it no longer reads; a bad line is one error naming the file and line."""

import os

import pytest

from nmt_cli.errors import ConfigError
from nmt_cli.serve.keys import Keys
from nmt_cli.serve.limits import RateLimit


def test_each_line_a_key_with_its_id_and_limits(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# the keys\nk1 alice req-limit=5 req-limit-daily=100\n\nk2   # no id: its line\nk3 bob\n")
    keys = Keys(path=str(path))
    assert keys.match("k1").id == "alice" and keys.match("k1").rate == RateLimit(req_limit=5, req_limit_daily=100)
    assert keys.match("k2").id == "line4" and keys.match("k2").rate is None
    assert keys.match("k3").id == "bob" and keys.match("k4") is None and keys.match("") is None


@pytest.mark.parametrize(
    ("text", "line"), [("k1 alice req-limit=x\n", 1), ("k1\nk2 bob rate=5\n", 2), ("k\u00e9y\n", 1)]
)
def test_a_bad_line_is_named(tmp_path, text, line):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"--api-key-file {path} line {line}: write KEY"):
        Keys(path=str(path))


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_the_last_keys(tmp_path, caplog):
    path = tmp_path / "keys"
    path.write_text("old alice\n")
    keys = Keys(path=str(path))
    new = tmp_path / "keys.new"
    new.write_text("new alice\n")
    os.replace(new, path)  # rotated as a deployment tool writes it: a new file renamed over the old one
    assert keys.match("old") is None and keys.match("new").id == "alice"
    path.write_text("new alice rate=1\n")
    assert keys.match("new").id == "alice"  # the broken file is refused, the last keys kept
    assert "line 1: write KEY" in caplog.text and "the keys read before are kept" in caplog.text
    path.unlink()
    assert keys.match("new").id == "alice"
