"""Target prefixes: every output of beam search, greedy search and sampling (n-best too) begins with its prefix, the
prefix is scored with the model's own log-probs, sentences without one search exactly as before, composition with
--no-repeat-ngram-size, the checks of a prefix, and `nmt generate --prefix-file` end to end."""

import numpy as np
import pytest
import torch
from conftest import nmt

from nmt_cli.config import SearchConfig
from nmt_cli.data.dataset import load_vocab
from nmt_cli.data.vocab import BOS, UNK
from nmt_cli.errors import DataError
from nmt_cli.search.beam import length_penalty
from nmt_cli.search.ngram import repeated_ngram
from nmt_cli.search.prefix import PrefixSource, prefix_problem, prefix_source
from nmt_cli.search.rules import SentenceRules, read_rules
from nmt_cli.search.translate import SearchRequest, Translator, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

SETTINGS = {
    "beam": dict(beam=4, nbest=3),
    "greedy": dict(beam=1),
    "sampling": dict(sampling=True, beam=1, temperature=1.5, seed=5),
    "sampling-nbest": dict(sampling=True, beam=1, nbest=3, seed=7),
}


@pytest.fixture
def translator(tiny_model, toy_data_bin):
    return Translator(tiny_model, load_vocab(toy_data_bin), torch.device("cpu"))


def sources_and_prefixes(translator, n, seed=0, empty_every=3):
    """Random sources with random prefixes of up to 4 pieces (every `empty_every`-th one empty)."""
    g = np.random.default_rng(seed)
    sources = [g.integers(4, translator.vocab.n_pieces, int(m)) for m in g.integers(1, 10, n)]
    prefixes = [
        g.integers(4, translator.vocab.n_pieces, 0 if i % empty_every == 0 else int(g.integers(1, 5))) for i in range(n)
    ]
    return sources, prefixes


@pytest.mark.parametrize("how", SETTINGS)
def test_every_output_begins_with_its_prefix(translator, how):
    sources, prefixes = sources_and_prefixes(translator, 30)
    cfg = SearchConfig(max_len_a=1.0, max_len_b=6, **SETTINGS[how])
    results = translate(translator, SearchRequest(sources, cfg, 2000, constraints=prefix_source(prefixes)))
    plain = translate(translator, SearchRequest(sources, cfg, 2000))
    assert sum(hyps[0].tokens[: len(p)] != p.tolist() for hyps, p in zip(plain, prefixes)) > 10  # not by chance
    for hyps, prefix in zip(results, prefixes):
        assert len(hyps) == cfg.nbest
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix.tolist()
            assert np.isfinite(h.score)


def model_log_probs(model, src, tokens):
    """The model's log-prob of each of `tokens` after the ones before it (teacher forced, step by step)."""
    enc = model.encode(torch.tensor([src.tolist()]), None)
    cache, prev, out = model.init_cache(enc, 1), torch.tensor([BOS]), []
    for token in tokens:
        log_probs, cache = model.decode_step(prev, cache)
        out.append(float(log_probs[0, token]))
        prev = torch.tensor([token])
    return out


@pytest.mark.parametrize("how", ["beam", "greedy"])
def test_the_prefix_is_scored(translator, how):
    sources, prefixes = sources_and_prefixes(translator, 8, seed=1, empty_every=100)
    cfg = SearchConfig(max_len_a=1.0, max_len_b=6, lenpen=0.6, **SETTINGS[how])
    with torch.inference_mode():
        results = translate(translator, SearchRequest(sources, cfg, 2000, constraints=prefix_source(prefixes)))
        for src, prefix, hyps in zip(sources, prefixes, results):
            for h in hyps:
                steps = model_log_probs(translator.model, np.append(src, 3), prefix.tolist())
                assert h.positional_scores[: len(prefix)] == pytest.approx(steps, abs=1e-4)
                penalty = length_penalty(len(h.tokens) + 1, cfg.lenpen, cfg.lenpen_style)
                assert h.score == pytest.approx(sum(h.positional_scores) / penalty, abs=1e-4)


@pytest.mark.parametrize("how", SETTINGS)
def test_sentences_without_a_prefix_search_as_before(translator, how):
    """Empty prefixes give no constraint at all; beside sentences with one, they get today's results exactly."""
    sources, prefixes = sources_and_prefixes(translator, 20, seed=2, empty_every=2)
    assert prefix_source([p[:0] for p in prefixes]) is None
    cfg = SearchConfig(max_len_a=1.0, max_len_b=6, **SETTINGS[how])
    # Sampling draws for every row, so its rows without a prefix keep their numbers only where all have none.
    mixed = PrefixSource([p[:0] for p in prefixes] if cfg.sampling else prefixes)
    a = translate(translator, SearchRequest(sources, cfg, 2000, constraints=mixed))
    b = translate(translator, SearchRequest(sources, cfg, 2000))
    for i, (x, y) in enumerate(zip(a, b)):
        if cfg.sampling or not len(prefixes[i]):
            assert [(h.tokens, h.score, h.positional_scores) for h in x] == [
                (h.tokens, h.score, h.positional_scores) for h in y
            ]


@pytest.mark.parametrize("how", ["beam", "sampling-nbest"])
def test_prefix_and_no_repeated_ngrams_compose(translator, how):
    sources, prefixes = sources_and_prefixes(translator, 30, seed=3)
    prefixes = [p if repeated_ngram(p.tolist(), 2) is None else p[:1] for p in prefixes]
    cfg = SearchConfig(max_len_a=1.0, max_len_b=8, no_repeat_ngram_size=2, **SETTINGS[how])
    results = translate(translator, SearchRequest(sources, cfg, 2000, constraints=prefix_source(prefixes)))
    for hyps, prefix in zip(results, prefixes):
        for h in hyps:
            assert h.tokens[: len(prefix)] == prefix.tolist()
            assert repeated_ngram(h.tokens, 2) is None, h.tokens


def test_prefix_problems():
    cfg = SearchConfig(max_len_a=1.0, max_len_b=2)
    assert prefix_problem(np.array([5, 6, 7]), 1, cfg, 64) is None  # 1 + 2 pieces may be output
    assert "has 4 pieces, more than the 3" in prefix_problem(np.array([5, 6, 7, 8]), 1, cfg, 64)
    assert "more than the 3" in prefix_problem(np.arange(4, 40), 1, SearchConfig(max_len_b=100), 4)  # positions
    assert "empty input" in prefix_problem(np.array([5]), 0, cfg, 64)
    assert prefix_problem(np.array([], dtype=np.int64), 0, cfg, 64) is None
    assert "vocabulary lacks" in prefix_problem(np.array([5, UNK]), 1, cfg, 64)  # forced, it would be <unk>, not text
    repeats = SearchConfig(no_repeat_ngram_size=2)
    assert "--no-repeat-ngram-size 2" in prefix_problem(np.array([5, 6, 5, 6]), 5, repeats, 64)
    assert prefix_problem(np.array([5, 6, 6, 5]), 5, repeats, 64) is None


def test_prefixes_from_text(translator):
    """The Python API's prefixes: search/rules.py's read_rules from raw text, checked as generate and serve check
    them, into the request's rules."""
    sources = [np.array([5, 6]), np.array([7])]
    cfg = SearchConfig(max_len_a=0, max_len_b=3)

    def read(texts):
        return read_rules(translator.vocab, {"prefix": texts}, src_lens=[2, 1], search=cfg, max_positions=64)

    assert read(["", ""]) == (SentenceRules(), SentenceRules())
    results = translate(translator, SearchRequest(sources, cfg, 100, rules=read(["1 2", ""])))
    assert translator.vocab.decode(results[0][0].tokens).startswith("1 2")
    with pytest.raises(DataError, match=r"prefix\[1\]: the prefix has \d+ pieces, more than the 3 "):
        read(["", "1 2 3 4"])
    with pytest.raises(DataError, match="1 values of prefix for 2 sources"):
        read([""])
    with pytest.raises(DataError, match=r"prefix\[0\]: the prefix holds a line break"):
        read(["1\n2", ""])


def test_generate_prefix_file(tiny_checkpoint, tmp_path):
    src, prefix = tmp_path / "src.txt", tmp_path / "prefix.txt"
    src.write_text("1 2 3\n4 5 6 7\n0\n9 9 8\n")
    prefix.write_text("7 7\n\n3\n1 2 3 4\n")
    common = ["generate", "--path", tiny_checkpoint, "--input", src, "--device", "cpu", "--beam", 3, "--nbest", 2]
    r = nmt(*common, "--prefix-file", prefix)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert len(lines) == 8
    for i, p in enumerate(prefix.read_text().splitlines()):
        assert all(line.startswith(p) for line in lines[2 * i : 2 * i + 2]), (p, lines)
    plain = nmt(*common)
    assert lines[2:4] == plain.stdout.splitlines()[2:4]  # the line without a prefix
    prefix.write_text("\n\n\n\n")
    assert nmt(*common, "--prefix-file", prefix).stdout == plain.stdout  # an empty prefix file: today's output


def test_generate_prefix_file_stdin_and_errors(tiny_checkpoint, tmp_path):
    prefix = tmp_path / "prefix.txt"
    prefix.write_text("7\n8\n")
    common = ["generate", "--path", tiny_checkpoint, "--device", "cpu", "--beam", 2, "--prefix-file", prefix]
    r = nmt(*common, "--input", "-", input="1 2\n3 4\n")
    assert r.exit_code == 0, r.output
    assert [line[0] for line in r.stdout.splitlines()] == ["7", "8"]
    for text, said in (
        ("1 2\n", f"--input stdin ends before line 2 of --prefix-file {prefix}"),
        ("1\n2\n3\n", f"--prefix-file {prefix} ends before line 3 of --input stdin"),
    ):
        r = nmt(*common, "--input", "-", "--buffer-size", 1, input=text)
        assert r.exit_code == 1 and said in r.stderr, r.output
    src = tmp_path / "src.txt"
    src.write_text("1\n2\n3\n")
    r = nmt(*common, "--input", src)
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: --prefix-file {prefix} ends before line 3 of --input {src}; give one prefix line (an empty one for "
        "none) per input line"
    )
    prefix.write_text("1 2 3 4 5 6 7 8\n\n\n")
    r = nmt(*common, "--input", src, "--max-len-a", 0, "--max-len-b", 3)
    assert r.exit_code == 1 and f"error: {prefix}:1: the prefix has " in r.stderr, r.output
    r = nmt("generate", "--path", tiny_checkpoint, "--prefix-file", prefix, tmp_path)
    assert r.exit_code == 1 and "--prefix-file is line-aligned with --input" in r.stderr, r.output
