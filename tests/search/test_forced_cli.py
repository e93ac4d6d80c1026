"""`nmt score-pairs` and `nmt generate --print-alignment` through the CLI, on a tiny trained checkpoint."""

import json

import pytest
from conftest import nmt

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

SOURCES = ["1 2 3", "4 5 6 7 8", "", "9 0", "3 3 1 2 5 6 7"]


@pytest.fixture
def source_file(tmp_path):
    f = tmp_path / "src.txt"
    f.write_text("\n".join(SOURCES) + "\n")
    return f


def test_score_pairs_gives_generate_its_own_scores(tiny_checkpoint, source_file, tmp_path):
    search = ["--beam", 4, "--lenpen", 1.2, "--lenpen-style", "fairseq", "--unkpen", 0.5]
    r = nmt("generate", "--path", tiny_checkpoint, "--input", source_file, "--output-format", "jsonl", *search)
    assert r.exit_code == 0, r.output
    best = [json.loads(line)["hypotheses"][0] for line in r.stdout.splitlines()]
    target = tmp_path / "tgt.txt"
    target.write_text("\n".join(h["text"] for h in best) + "\n")
    args = ["score-pairs", "--path", tiny_checkpoint, "--source", source_file, "--target", target, *search[2:]]
    plain = nmt(*args)
    assert plain.exit_code == 0, plain.output
    assert "scored 5 pairs" in plain.stderr
    scores = [float(line) for line in plain.stdout.splitlines()]
    records = [json.loads(line) for line in nmt(*args, "--output-format", "jsonl").stdout.splitlines()]
    assert [r["id"] for r in records] == list(range(len(SOURCES)))
    same_pieces = 0
    for source, h, score, record in zip(SOURCES, best, scores, records):
        assert record["score"] == pytest.approx(score, abs=1e-4)
        rounding = 5e-5 * (len(record["token_scores"]) + 1)  # each value rounded to 4 decimals
        assert record["log_prob"] == pytest.approx(sum(record["token_scores"]), abs=rounding)
        assert len(record["token_scores"]) == len(record["tokens"]) + 1
        if source and record["tokens"] == h["tokens"]:  # the text re-encodes to the search's own pieces
            assert score == pytest.approx(h["score"], abs=2e-4)  # both rounded to 4 decimals
            same_pieces += 1
    assert same_pieces >= 2


def test_score_pairs_of_pieces_gives_every_hypothesis_its_own_score(tiny_checkpoint, source_file, tmp_path):
    """--target-format pieces scores the pieces generate wrote (jsonl tokens), so that every hypothesis, those whose
    text would re-encode to other pieces included, scores its own score."""
    sampled = ["--sampling", "--beam", 1, "--nbest", 8, "--seed", 3]  # samples hold pieces a text does not encode to
    r = nmt("generate", "--path", tiny_checkpoint, "--input", source_file, "--output-format", "jsonl", *sampled)
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in r.stdout.splitlines()]
    pairs = [(s, h) for s, rec in zip(SOURCES, records) for h in rec["hypotheses"] if s]  # an empty input: no search
    source, target = tmp_path / "src4.txt", tmp_path / "pieces.txt"
    source.write_text("".join(f"{s}\n" for s, _ in pairs))
    target.write_text("".join(" ".join(h["tokens"]) + "\n" for _, h in pairs))
    args = [
        "score-pairs",
        "--path",
        tiny_checkpoint,
        "--source",
        source,
        "--target",
        target,
        "--output-format",
        "jsonl",
    ]
    scored = nmt(*args, "--target-format", "pieces")
    assert scored.exit_code == 0, scored.output
    for (_, h), line in zip(pairs, scored.stdout.splitlines()):
        record = json.loads(line)
        assert record["tokens"] == h["tokens"]
        assert record["score"] == pytest.approx(h["score"], abs=2e-4)
    target.write_text("".join("\u2581 3 \u2581 6\n" for _ in pairs))  # "3 6" in other pieces than its own (▁3 ▁6)
    split = [json.loads(line) for line in nmt(*args, "--target-format", "pieces").stdout.splitlines()]
    target.write_text("".join("3 6\n" for _ in pairs))
    as_text = [json.loads(line) for line in nmt(*args).stdout.splitlines()]
    assert split[0]["tokens"] == ["\u2581", "3", "\u2581", "6"] and as_text[0]["tokens"] == ["\u25813", "\u25816"]
    assert split[0]["score"] != as_text[0]["score"]
    target.write_text("".join(" ".join(h["tokens"]) + "\n" for _, h in pairs[:-1]) + "▁zzææ </s>\n")
    bad = nmt(*args, "--target-format", "pieces")
    assert bad.exit_code == 1 and f"error: {target}:{len(pairs)}: " in bad.output and "is not a piece" in bad.output


def test_score_pairs_refuses_files_of_different_lengths(tiny_checkpoint, source_file, tmp_path):
    target = tmp_path / "tgt.txt"
    target.write_text("1\n2\n")
    r = nmt("score-pairs", "--path", tiny_checkpoint, "--source", source_file, "--target", target)
    assert r.exit_code == 1
    assert r.output.strip() == (
        f"error: --target {target} ends before line 3 of --source {source_file}; give one translation per source line"
    )


def test_score_pairs_names_the_bad_line(tiny_checkpoint, source_file, tmp_path):
    target = tmp_path / "tgt.txt"
    target.write_bytes(b"1\n2\n\xff\n4\n5\n")
    r = nmt("score-pairs", "--path", tiny_checkpoint, "--source", source_file, "--target", target)
    assert r.exit_code == 1 and f"error: {target}:3: invalid UTF-8" in r.output and "Traceback" not in r.output


def test_generate_prints_fairseq_alignment_lines(tiny_checkpoint, source_file):
    r = nmt(
        "generate", "--path", tiny_checkpoint, "--input", source_file, "--output-format", "fairseq",
        "--beam", 3, "--nbest", 2, "--print-alignment", "hard", "--alignment-layer", 0,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    hyps = [line.split("\t") for line in lines if line.startswith("H-")]
    aligns = [line.split("\t") for line in lines if line.startswith("A-")]
    assert len(hyps) == len(aligns) == 2 * len(SOURCES)
    for h, a in zip(hyps, aligns):
        assert h[0][2:] == a[0][2:]
        pairs = [tuple(map(int, p.split("-"))) for p in a[1].split()]
        n_tgt = len(h[2].split())
        assert [t for _, t in pairs] == list(range(n_tgt))
        n_src = len(next(line for line in lines if line.startswith(f"S-{h[0][2:]}\t")).split("\t")[1].split())
        assert all(0 <= s <= 2 * n_src for s, _ in pairs)  # pieces: at most two per digit word here
    assert lines.index(next(line for line in lines if line.startswith("A-0"))) == 4  # S, H, D, P, then A


def test_generate_soft_alignment_in_jsonl(tiny_checkpoint, source_file):
    r = nmt(
        "generate", "--path", tiny_checkpoint, "--input", source_file, "--output-format", "jsonl",
        "--print-alignment", "soft",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    for line in r.stdout.splitlines():
        h = json.loads(line)["hypotheses"][0]
        assert len(h["alignment"]) == len(h["tokens"])
        assert all(abs(sum(row) - 1) < 1e-3 for row in h["alignment"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--print-alignment", "hard"], "error: --print-alignment hard writes an A- line"),
        (["--alignment-layer", 1], "error: --alignment-layer 1 picks the layer --print-alignment reads"),
        (
            ["--print-alignment", "hard", "--output-format", "jsonl", "--alignment-layer", 2],
            "error: --alignment-layer 2: the checkpoint's decoder has 2 layers (0 to 1)",
        ),
    ],
)
def test_generate_refuses_alignments_it_cannot_give(tiny_checkpoint, source_file, args, message):
    r = nmt("generate", "--path", tiny_checkpoint, "--input", source_file, *args)
    assert r.exit_code == 1 and r.output.startswith(message) and len(r.output.strip().splitlines()) == 1


def test_generate_aligns_a_binarized_split(tiny_checkpoint, toy_data_bin):
    r = nmt("generate", toy_data_bin, "--path", tiny_checkpoint, "--beam", 2, "--print-alignment", "soft")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    hyps = [line.split("\t")[2].split() for line in lines if line.startswith("H-")]
    rows = [line.split("\t")[1].split() for line in lines if line.startswith("A-")]
    assert len(hyps) == len(rows) == sum(line.startswith("S-") for line in lines) > 0
    for pieces, row in zip(hyps, rows):
        assert len(row) == len(pieces)
        assert all(abs(sum(map(float, weights.split(","))) - 1) < 1e-4 for weights in row)
