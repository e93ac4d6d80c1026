"""Lexically constrained decoding (search/lexical.py): every output contains its phrases, on a random model and
through `nmt generate --constraints-file`; no phrases is plain beam search, bit for bit."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from nmt_cli.cli import cli
from nmt_cli.config import SearchConfig
from nmt_cli.data.batching import pad_sources
from nmt_cli.data.dataset import load_vocab
from nmt_cli.errors import DataError
from nmt_cli.search.constraint import all_of
from nmt_cli.search.hypothesis import hypothesis_record
from nmt_cli.search.lexical import (
    LexicalConstraint,
    LexicalConstraints,
    borders,
    check_fits,
    check_with_prefixes,
    checked_phrases,
    encode_phrases,
    pieces_needed,
    without_duplicates,
)
from nmt_cli.search.rules import OPTIONS, SentenceRules, read_rules, rules_source
from nmt_cli.search.translate import SearchRequest, Translator, load_translator, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def contains(tokens, phrase):
    return any(tokens[i : i + len(phrase)] == list(phrase) for i in range(len(tokens) - len(phrase) + 1))


def random_case(n, seed, n_pieces):
    g = np.random.default_rng(seed)
    sources = [g.integers(4, n_pieces, g.integers(1, 7)) for _ in range(n)]
    phrases = [[g.integers(4, n_pieces, g.integers(1, 4)).tolist() for _ in range(g.integers(1, 4))] for _ in range(n)]
    return sources, phrases


@pytest.fixture
def translator(tiny_model, toy_data_bin):
    return Translator(tiny_model, load_vocab(toy_data_bin), torch.device("cpu"))


@pytest.mark.parametrize(("beam", "nbest"), [(4, 1), (4, 4), (1, 1)])
def test_every_output_contains_its_phrases(translator, beam, nbest):
    sources, phrases = random_case(200, beam + nbest, translator.vocab.n_pieces)
    cfg = SearchConfig(beam=beam, nbest=nbest, max_len_a=1.0, max_len_b=9)
    results = translate(translator, SearchRequest(sources, cfg, 1000, constraints=LexicalConstraints(phrases)))
    assert [len(hyps) for hyps in results] == [nbest] * len(sources)
    for hyps, sentence in zip(results, phrases):
        for h in hyps:
            assert all(contains(h.tokens, p) for p in sentence), (h.tokens, sentence)
            assert np.isfinite(h.score)


def test_phrases_that_fill_the_whole_output_are_forced(translator):
    sources, phrases = random_case(60, 7, translator.vocab.n_pieces)
    for sentence in phrases:  # no phrase inside another: each takes its own pieces
        sentence[:] = [p for i, p in enumerate(sentence) if not any(contains(q, p) for q in sentence[:i])]
    for need in sorted({sum(map(len, s)) for s in phrases}):
        group = [i for i, s in enumerate(phrases) if sum(map(len, s)) == need]
        cfg = SearchConfig(beam=4, max_len_a=0, max_len_b=need)
        cases = LexicalConstraints([phrases[i] for i in group])
        for hyps, i in zip(
            translate(translator, SearchRequest([sources[i] for i in group], cfg, 1000, constraints=cases)), group
        ):
            assert len(hyps[0].tokens) <= need
            assert all(contains(hyps[0].tokens, p) for p in phrases[i])


def test_no_phrases_is_plain_beam_search_bit_for_bit(translator):
    sources, _ = random_case(40, 3, translator.vocab.n_pieces)
    cfg = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=5)
    plain = translate(translator, SearchRequest(sources, cfg, 1000))
    unconstrained = translate(
        translator, SearchRequest(sources, cfg, 1000, constraints=LexicalConstraints([[]] * len(sources)))
    )
    assert [[(h.tokens, h.score, h.positional_scores) for h in hyps] for hyps in unconstrained] == [
        [(h.tokens, h.score, h.positional_scores) for h in hyps] for hyps in plain
    ]


def test_a_phrase_the_output_holds_anyway_changes_nothing(trained_copy_checkpoint, toy_corpus):
    translator, _ = load_translator(trained_copy_checkpoint, torch.device("cpu"), None)
    lines = (toy_corpus / "test.src").read_text().splitlines()[:30]
    sources = [np.asarray(ids) for ids in translator.vocab.encode(lines)]
    cfg = SearchConfig(beam=4)
    plain = [hyps[0].tokens for hyps in translate(translator, SearchRequest(sources, cfg, 1000))]
    phrases = [[out[len(out) // 2 : len(out) // 2 + 2]] if out else [] for out in plain]
    constrained = [
        hyps[0].tokens
        for hyps in translate(translator, SearchRequest(sources, cfg, 1000, constraints=LexicalConstraints(phrases)))
    ]
    assert all(contains(out, p) for out, sentence in zip(constrained, phrases) for p in sentence)
    # The banks share the beam, so a sentence may keep fewer hypotheses that hold the phrase than plain beam
    # search keeps, and end elsewhere; the model's own translation survives for most.
    assert sum(a == b for a, b in zip(constrained, plain)) >= 0.9 * len(plain), (constrained, plain)


def test_a_broken_partial_match_falls_back_as_far_as_the_phrase_allows():
    lexical = LexicalConstraint([[[5, 5, 6]], [[5, 6]]], torch.device("cpu"))
    state = lexical.start(torch.zeros(2, dtype=torch.long))
    met = []
    for token in (5, 5, 5, 6):  # 5 5 6 ends it; 5 6 too
        state = lexical.advance(state, torch.tensor([token, token]))
        met.append(state.met[:, 0].tolist())
    assert met == [[False, False], [False, False], [False, False], [True, True]]
    lexical = LexicalConstraint([[[5, 6]]], torch.device("cpu"))
    state = lexical.start(torch.zeros(1, dtype=torch.long))
    for token in (5, 7, 6):  # 5 7 6 holds no 5 6
        state = lexical.advance(state, torch.tensor([token]))
    assert not state.met.any()


def test_refusals(toy_data_bin):
    vocab = load_vocab(toy_data_bin)
    with pytest.raises(DataError, match=r"c.txt:2: constraint 2 is empty"):
        encode_phrases(vocab, [["1"], ["2", ""]], ["c.txt:1", "c.txt:2"])
    with pytest.raises(DataError, match=r"c.txt:1: constraint 1 .* lacks"):
        encode_phrases(vocab, [["\u4e2d"]], ["c.txt:1"])
    assert encode_phrases(vocab, [["1 2", "1 2"], []], ["a", "b"]) == [[vocab.encode(["1 2"])[0]], []]
    sources, fits = [np.array([4, 5]), np.array([6])], SearchConfig(max_len_a=0, max_len_b=5)
    assert [r.phrases for r in from_text(vocab, [["1 2", "3"], []], sources, fits)] == [
        tuple(map(tuple, vocab.encode(["1 2", "3"]))),
        (),
    ]
    with pytest.raises(DataError, match=r"constraints\[1\]: constraint 1 is empty"):
        from_text(vocab, [[], [" "]], sources, fits)
    with pytest.raises(DataError, match=r"constraints\[1\]: the constraints take \d+ pieces, but this output may"):
        from_text(vocab, [[], ["1 2 3", "4 5 6"]], sources, fits)
    with pytest.raises(DataError, match=r"1 values of constraints for 2 sources"):
        from_text(vocab, [["1"]], sources, fits)
    cfg = SearchConfig(max_len_a=0, max_len_b=3)
    check_fits([[[4, 5], [6]]], [2], cfg, 64, ["c.txt:1"])
    with pytest.raises(DataError, match=r"c.txt:1: the constraints take 4 pieces, but this output may have 3"):
        check_fits([[[4, 5], [6, 7]]], [2], cfg, 64, ["c.txt:1"])
    with pytest.raises(DataError, match=r"c.txt:1: .* may have 7; the model's 8 positions allow no more; shorten"):
        check_fits([[[4] * 9]], [2], SearchConfig(max_len_b=100), 8, ["c.txt:1"])  # not "raise --max-len-b"
    with pytest.raises(DataError, match=r"c.txt:1: the input line is empty"):
        check_fits([[[4]]], [0], cfg, 64, ["c.txt:1"])
    constraints = next(o for o in OPTIONS if o.name == "constraints")
    assert "sampling" in constraints.problem(SearchConfig(sampling=True, beam=1), None)
    assert constraints.problem(SearchConfig(beam=1), None) is None


def from_text(vocab, lines, sources, search):
    """The Python API's constraints: search/rules.py's read_rules from raw text (one list of phrases per source)."""
    return read_rules(
        vocab, {"constraints": lines}, src_lens=[len(s) for s in sources], search=search, max_positions=64
    )


def test_phrases_inside_another_are_dropped_and_a_repeated_ngram_refused(toy_data_bin):
    """A phrase inside another is met wherever that one is: dropped, it no longer counts toward the output's length
    ("3" inside "2 3" fits 2 pieces). A phrase that repeats an n-gram cannot be written under that n-gram ban."""
    vocab = load_vocab(toy_data_bin)
    [[inner], [outer]] = vocab.encode(["3"]), vocab.encode(["2 3"])
    assert contains(outer, inner) and len(outer) == 2
    fits = SearchConfig(max_len_a=0, max_len_b=2)
    assert checked_phrases(vocab, [["2 3", "3"]], [2], fits, 64, ["c.txt:1"]) == [[outer]]
    assert checked_phrases(vocab, [["4 4 4"]], [2], SearchConfig(max_len_b=9, no_repeat_ngram_size=3), 64, ["a"])
    with pytest.raises(DataError, match=r"c.txt:1: a constraint repeats an n-gram of 2 pieces"):
        checked_phrases(vocab, [["4 4 4"]], [2], SearchConfig(max_len_b=9, no_repeat_ngram_size=2), 64, ["c.txt:1"])
    with pytest.raises(TypeError, match=r"constraints\[0\] is a string"):
        from_text(vocab, ["3"], [np.array([4])], fits)


def test_pieces_needed_is_the_search_s_own_count():
    """pieces_needed (the host's, for refusals up front) equals LexicalConstraint.need after the same pieces."""
    g = np.random.default_rng(5)
    for _ in range(300):
        phrases = [g.integers(4, 7, g.integers(1, 4)).tolist() for _ in range(g.integers(1, 4))]
        written = g.integers(4, 8, g.integers(0, 8)).tolist()
        lexical = LexicalConstraint([phrases], torch.device("cpu"))
        state = lexical.start(torch.zeros(1, dtype=torch.long))
        for token in written:
            state = lexical.advance(state, torch.tensor([token]))
        assert pieces_needed(phrases, written) == int(lexical.need(state.sent, state.pos, state.met)), (
            phrases,
            written,
        )


def test_a_prefix_that_leaves_its_phrases_no_room_is_refused():
    """Each fits alone; together the prefix's pieces and those its phrases still need after it must fit too."""
    cfg = SearchConfig(max_len_a=0, max_len_b=3)
    check_with_prefixes([[[6, 7]]], [[6]], [2], cfg, 64, ["p.txt:1"])  # 6 7: the prefix begins the phrase
    check_with_prefixes([[[6, 7]]], [[5]], [2], cfg, 64, ["p.txt:1"])  # 5 6 7
    check_with_prefixes([[], [[4]]], [[4, 5, 6], []], [2, 2], cfg, 64, ["p.txt:1", "p.txt:2"])
    with pytest.raises(DataError, match=r"p.txt:2: the prefix's first 2 pieces and the 2 the constraints then need"):
        check_with_prefixes([[], [[6, 7]]], [[], [4, 5]], [2, 2], cfg, 64, ["p.txt:1", "p.txt:2"])


@pytest.mark.parametrize("beam", [4, 1])
def test_a_search_that_finds_fewer_hypotheses_than_asked_returns_those(translator, beam):
    """A phrase as long as the whole output has one hypothesis: n-best 3 gives it alone, not two empty ones; rules no
    output can keep (a phrase that repeats its n-gram, which the CLI refuses) give `nothing_found()`, and the
    greedy search no longer fails on them."""
    sources, _ = random_case(20, 3, translator.vocab.n_pieces)
    cfg = SearchConfig(beam=beam, nbest=min(3, beam), max_len_a=0, max_len_b=3)
    results = translate(
        translator, SearchRequest(sources, cfg, 1000, constraints=LexicalConstraints([[[5, 6, 7]]] * 20))
    )
    assert all(len(hyps) == 1 and hyps[0].tokens == [5, 6, 7] and hyps[0].found for hyps in results)
    banned = SearchConfig(beam=beam, nbest=min(3, beam), max_len_b=9, no_repeat_ngram_size=2)
    rules = all_of(LexicalConstraints([[[5, 5, 5]]] * 20))
    results = translate(translator, SearchRequest(sources, banned, 1000, constraints=rules))
    assert all(len(hyps) == 1 and not hyps[0].found and hyps[0].tokens == [] for hyps in results)
    assert json.loads(json.dumps(hypothesis_record(results[0][0], translator.vocab)))["score"] is None


def generate(ckpt, *args, input=None):
    return CliRunner().invoke(cli, ["generate", "--path", str(ckpt), *map(str, args)], input=input)


def test_generate_with_a_constraints_file(trained_copy_checkpoint, tmp_path):
    """A file of constraints read beside the input: whole, a line at a time from stdin, and by shard (the trained
    copy model: decisive beams, whose outputs do not flip between batches of other shapes, as the untrained one's
    near-ties did)."""
    tiny_checkpoint = trained_copy_checkpoint
    src, constraints = tmp_path / "in.txt", tmp_path / "constraints.txt"
    src.write_text("1 2 3\n4 5 6 7\n\n0 0\n")
    constraints.write_text("9 9\t8\n\n\n7\n")
    r = generate(tiny_checkpoint, "--input", src, "--constraints-file", constraints, "--beam", 4, "--nbest", 2)
    assert r.exit_code == 0, r.output
    out = r.stdout.split("\n")[:-1]
    assert len(out) == 8 and out[4:6] == ["", ""]
    assert all("9 9" in line and "8" in line for line in out[:2]), out
    assert all("7" in line for line in out[6:]), out
    stdin = generate(tiny_checkpoint, "--input", "-", "--constraints-file", constraints, "--beam", 4, "--nbest", 2,
                     "--buffer-size", 1, input=src.read_text())  # fmt: skip
    assert stdin.exit_code == 0, stdin.output
    assert stdin.stdout == r.stdout
    shard = generate(tiny_checkpoint, "--input", src, "--constraints-file", constraints, "--beam", 4, "--nbest", 2,
                     "--num-shards", 2, "--shard-id", 1)  # fmt: skip
    assert shard.exit_code == 0, shard.output
    assert shard.stdout.split("\n")[:-1] == out[4:]  # lines 3 and 4, with their own constraints


@pytest.mark.parametrize(
    ("constraints", "extra", "message"),
    [
        ("1\n2\n", (), r"constraints.txt ends before line 3 of --input .*in.txt; give one line"),
        ("1\n2\n3\n4\n", (), r"--input .*in.txt ends before line 4 of --constraints-file .*constraints.txt"),
        ("1\n2\t\n3\n", (), r"constraints.txt:2: constraint 2 is empty"),
        ("1\n2\n3 4 5 6 7 8\n", ("--max-len-a", 0, "--max-len-b", 5), r"constraints.txt:3: the constraints take"),
        ("1\n2\n3\n", ("--sampling", "--beam", 1), r"--constraints-file needs beam search"),
    ],
)
def test_generate_refuses(tiny_checkpoint, tmp_path, constraints, extra, message):
    src, path = tmp_path / "in.txt", tmp_path / "constraints.txt"
    src.write_text("1 2\n3\n4 5\n")
    path.write_text(constraints)
    r = generate(tiny_checkpoint, "--input", src, "--constraints-file", path, *extra)
    assert r.exit_code == 1, r.output
    assert r.stderr.count("error:") == 1 and "Traceback" not in r.output
    assert len(r.stderr.strip().splitlines()[-1]) and __import__("re").search(message, r.stderr), r.stderr


def test_generate_refuses_a_stdin_longer_than_its_constraints(tiny_checkpoint, tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text("1\n")
    r = generate(tiny_checkpoint, "--input", "-", "--constraints-file", path, input="1 2\n3\n")
    assert r.exit_code == 1
    assert "--constraints-file " + str(path) + " ends before line 2 of --input stdin" in r.stderr


def test_generate_refuses_a_side_file_longer_than_stdin_or_missing(tiny_checkpoint, tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text("1\n2\n3\n")
    r = generate(tiny_checkpoint, "--input", "-", "--constraints-file", path, input="1 2\n3\n")
    assert r.exit_code == 1 and f"--input stdin ends before line 3 of --constraints-file {path}" in r.stderr
    missing = generate(tiny_checkpoint, "--input", "-", "--prefix-file", tmp_path / "none.txt", input="1 2\n")
    assert (
        missing.exit_code == 1
        and missing.output.strip() == f"error: --prefix-file {tmp_path / 'none.txt'} does not exist"
    )


def test_generate_refuses_a_prefix_and_constraints_that_do_not_fit_together(tiny_checkpoint, tmp_path):
    src, prefixes, constraints = tmp_path / "in.txt", tmp_path / "p.txt", tmp_path / "c.txt"
    src.write_text("1 2\n3\n")
    prefixes.write_text("\n4 5\n")
    constraints.write_text("\n6 7\n")
    args = ["--input", src, "--prefix-file", prefixes, "--constraints-file", constraints, "--max-len-a", 0]
    r = generate(tiny_checkpoint, *args, "--max-len-b", 3)
    assert r.exit_code == 1 and r.stderr.count("error:") == 1, r.output
    assert f"{prefixes}:2: the prefix's first 2 pieces and the 2 the constraints then need make 4" in r.stderr
    fits = generate(tiny_checkpoint, *args, "--max-len-b", 4)
    assert fits.exit_code == 0, fits.output
    assert fits.stdout.split("\n")[1].startswith("4 5") and "6 7" in fits.stdout.split("\n")[1]


def test_generate_refuses_constraints_for_a_split(tiny_checkpoint, toy_data_bin, tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text("1\n")
    r = generate(tiny_checkpoint, toy_data_bin, "--constraints-file", path)
    assert r.exit_code == 1
    assert "--constraints-file is line-aligned with --input" in r.stderr


def test_borders_follow_their_definition():
    """borders[pos, m]: the phrase's first m pieces end its first pos pieces (checked by brute force)."""
    g = np.random.default_rng(0)
    for _ in range(500):
        n = int(g.integers(0, 9))
        table = np.zeros((1, 1, max(n, 1)), dtype=np.int64)
        table[0, 0, :n] = g.integers(4, 6, n)  # two pieces: many borders
        phrase = table[0, 0, :n].tolist()
        expected = np.zeros((max(n, 1), max(n, 1)), dtype=bool)
        for pos in range(n):
            for m in range(pos + 1):
                expected[pos, m] = phrase[:m] == phrase[pos - m : pos]
        assert (borders(table, np.array([[n]]))[0, 0] == expected).all(), phrase


@pytest.mark.parametrize("beam", [4, 1])
def test_phrases_compose_with_a_prefix_and_the_ngram_ban(translator, beam):
    """all_of(lexical, prefix): every output begins with its prefix and holds its phrases; the phrases still rank
    the beam (the composed constraint offers their rank_candidates)."""
    sources, phrases = random_case(120, 11, translator.vocab.n_pieces)
    g = np.random.default_rng(12)
    prefixes = [g.integers(4, translator.vocab.n_pieces, g.integers(0, 3)) for _ in sources]
    cfg = SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=12)
    rules = [SentenceRules(tuple(p), tuple(map(tuple, ph))) for p, ph in zip(prefixes, phrases)]
    assert rules_source(rules, cfg).for_batch(*batch_of(sources[:2]))[0].rank_candidates is not None
    results = translate(translator, SearchRequest(sources, cfg, 1000, rules=rules))
    for hyps, sentence, prefix in zip(results, phrases, prefixes):
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix.tolist(), (h.tokens, prefix)
            assert all(contains(h.tokens, p) for p in sentence), (h.tokens, sentence)


def batch_of(sources):
    src = pad_sources([np.asarray(s, dtype=np.int64) for s in sources])
    return src, torch.tensor([len(s) for s in sources]), np.arange(len(sources))


def test_duplicate_candidates_keep_their_best_copy():
    """A met phrase's next piece is a -inf candidate; the same piece advancing an unmet phrase must survive."""
    scores = torch.tensor([[float("-inf"), -1.0, -2.0, -3.0, -0.5]])
    keys = torch.tensor([[7, 7, 5, 5, 9]])
    kept = without_duplicates(scores, keys)
    assert kept.tolist() == [[float("-inf"), -1.0, -2.0, float("-inf"), -0.5]]
