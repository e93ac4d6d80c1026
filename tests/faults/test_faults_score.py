"""The fault suite for `nmt score`: empty files and directories, and lines read as generate reads them."""

import json

import pytest

pytest.register_assert_rewrite("fault_checks")  # before the import, so that its asserts show their values
from fault_checks import (
    check_fault_in_process,
    nmt,
)

pytest_plugins = ["fault_checks"]  # its fixtures: work, other_data_bin


# (id, setup(work) or None, args (strings with {w} for the work dir, {other} for other_data_bin), expected)
CASES = [
    (
        "score-empty-sys-and-ref",
        lambda w: [(w / n).write_text("") for n in ("hyp", "ref")],
        "score --sys {w}/hyp --ref {w}/ref",
        "is empty",
    ),
    (
        "score-sys-is-a-directory",
        lambda w: (w / "ref").write_text("a\n"),
        "score --sys {w}/run --ref {w}/ref",
        "is a directory",
    ),
]


@pytest.mark.parametrize("case_id,setup,args,expected", CASES, ids=[c[0] for c in CASES])
def test_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus):
    check_fault_in_process(case_id, setup, args, expected, work, other_data_bin, toy_corpus)


def test_score_drops_a_byte_order_mark(tmp_path):
    text = "the cat sat on the mat\nand then it left\n"
    (tmp_path / "bom").write_bytes("\ufeff".encode() + text.encode())
    (tmp_path / "plain").write_text(text)
    for sys_file, ref_file in (("bom", "bom"), ("bom", "plain"), ("plain", "bom")):
        r = nmt("score", "--sys", tmp_path / sys_file, "--ref", tmp_path / ref_file, "--metric", "sacrebleu", "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["score"] == 100.0, (sys_file, ref_file, r.stdout)


def test_score_ends_lines_at_newlines_only_as_generate_does(tmp_path):
    from nmt_cli.commands.generate import read_lines

    (tmp_path / "hyp").write_bytes(b"a b c\nd \r e f\ng h\n")  # a lone carriage return inside line 2
    (tmp_path / "ref").write_text("a b c\nd e f\ng h\n")
    with (tmp_path / "hyp").open("rb") as f:
        assert len([line for chunk in read_lines(f, 100, "hyp") for line in chunk]) == 3
    r = nmt("score", "--sys", tmp_path / "hyp", "--ref", tmp_path / "ref", "--metric", "sacrebleu")
    assert r.exit_code == 0, r.output
