"""The fault suite for `nmt export`: a signal while exporting, and what a killed export left."""

import pytest

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import assert_clean_failure, driven, nmt

# the converter writes part of the export, then the process is signalled
SIGNAL_IN_EXPORT = """
import nmt_cli.export.to_ctranslate2 as ct2
def convert(path, out, quantization):
    (out / "model.bin").write_bytes(b"half a model")
    os.kill(os.getpid(), SIG)
    time.sleep(5)
ct2.convert = convert
"""


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_while_exporting_stops_cleanly(signal_name, tiny_checkpoint, tmp_path):
    r = driven(SIGNAL_IN_EXPORT, signal_name, "export", "--path", tiny_checkpoint, "--output", tmp_path / "ct2")
    assert_clean_failure(r.returncode, r.stderr.decode(), f"stopped by {signal_name}", tmp_path)
    assert list(tmp_path.iterdir()) == [], "the export's temporary directory or lock was left"


def test_export_removes_what_a_killed_export_left(tiny_checkpoint, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    assert nmt("export", "--path", tiny_checkpoint, "--output", out).exit_code == 0
    stale = tmp_path / ".ct2.tmp-abc123"  # what SIGKILL leaves: the unrenamed temporary directory
    stale.mkdir()
    (stale / "model.bin").write_bytes(b"\0" * 100)
    r = nmt("export", "--path", tiny_checkpoint, "--output", out, "--force")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]
    assert "left by an interrupted run" in r.output
