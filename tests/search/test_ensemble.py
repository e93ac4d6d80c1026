"""Ensembles of checkpoints (search/ensemble.py): one checkpoint is the model itself, two copies of one translate as
it does, the step's scores are the members' weighted average, and members that do not fit together are refused."""

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import nmt

from nmt_cli.checkpoint.saved import read_saved_model
from nmt_cli.config import InferenceConfig, PreprocessConfig, SearchConfig, model_config
from nmt_cli.data.batching import pad_sources
from nmt_cli.data.dataset import SPM_FILE, ParallelDataset
from nmt_cli.data.preprocess import preprocess
from nmt_cli.data.vocab import BOS, PAD
from nmt_cli.errors import CheckpointError, ConfigError
from nmt_cli.model.transformer import Transformer, build_model
from nmt_cli.search.ensemble import Ensemble, check_members
from nmt_cli.search.forced import add_alignments, forced_scores
from nmt_cli.search.settings import search_bounds
from nmt_cli.search.translate import SearchRequest, load_translator, open_for_inference, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)


def variant(src: Path, dest: Path, *, noise_seed=None, shape=None, **fields) -> Path:
    """A copy of checkpoint `src` at `dest`: its weights perturbed (noise_seed), or those of a fresh model of
    another shape (shape: ModelConfig fields), and any other checkpoint fields replaced."""
    ckpt = torch.load(src, map_location="cpu", weights_only=True)
    if noise_seed is not None:
        g = torch.Generator().manual_seed(noise_seed)
        ckpt["model"] = {
            k: v + 0.2 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in ckpt["model"].items()
        }
    if shape is not None:
        cfg = model_config("transformer_tiny", vocab_size=ckpt["model_config"]["vocab_size"], **shape)
        torch.manual_seed(noise_seed or 0)
        ckpt["model_config"], ckpt["model"] = asdict(cfg), build_model(cfg).state_dict()
    ckpt.update(fields)
    torch.save(ckpt, dest)
    return dest


@pytest.fixture(scope="module")
def others(tiny_checkpoint, tmp_path_factory):
    """Two other members for tiny_checkpoint: its weights perturbed, and a model of another shape."""
    root = tmp_path_factory.mktemp("members")
    noisy = variant(tiny_checkpoint, root / "noisy.pt", noise_seed=1)
    other_shape = dict(decoder_layers=1, encoder_layers=3, d_model=24, d_ff=40, max_positions=48)
    return noisy, variant(tiny_checkpoint, root / "shaped.pt", noise_seed=2, shape=other_shape)


def sources(toy_data_bin, n=12):
    return [ParallelDataset(toy_data_bin, "test").src[i] for i in range(n)]


def opened(path, **kw):
    return open_for_inference(InferenceConfig(path=str(path), device="cpu", **kw), {})


def test_one_checkpoint_is_the_model_itself(tiny_checkpoint, toy_data_bin):
    for weights in (None, "3"):
        inference = opened(tiny_checkpoint, weights=weights)
        assert inference.members == (inference.saved,) and inference.weights == (1.0,)
        assert type(inference.translator().model) is Transformer
    single, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    cfg = SearchConfig(beam=3, nbest=2)
    a = translate(inference.translator(), SearchRequest(sources(toy_data_bin), cfg, 1000))
    b = translate(single, SearchRequest(sources(toy_data_bin), cfg, 1000))
    assert [[(h.tokens, h.score, h.positional_scores) for h in x] for x in a] == [
        [(h.tokens, h.score, h.positional_scores) for h in x] for x in b
    ]


@pytest.mark.parametrize(
    "cfg",
    [
        SearchConfig(beam=4, nbest=3, lenpen=0.6),
        SearchConfig(beam=1),
        SearchConfig(sampling=True, sampling_topk=6, beam=1, nbest=3, seed=5, temperature=1.3),
    ],
    ids=["beam", "greedy", "sampling"],
)
def test_two_copies_of_a_checkpoint_translate_as_it_does(tiny_checkpoint, toy_data_bin, cfg):
    inference = opened(f"{tiny_checkpoint}:{tiny_checkpoint}")
    ensemble = inference.translator()
    assert isinstance(ensemble.model, Ensemble) and ensemble.model.weights == (0.5, 0.5)
    single, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    a = translate(ensemble, SearchRequest(sources(toy_data_bin), cfg, 1000))
    b = translate(single, SearchRequest(sources(toy_data_bin), cfg, 1000))
    for x, y in zip(a, b):
        assert [h.tokens for h in x] == [h.tokens for h in y]
        assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-5)
        for hx, hy in zip(x, y):
            assert hx.positional_scores == pytest.approx(hy.positional_scores, abs=1e-5)


def test_every_member_is_quantised_as_one_model_is(tiny_checkpoint, toy_data_bin):
    from nmt_cli.model.quantize import Int8Linear

    ensemble = opened(f"{tiny_checkpoint}:{tiny_checkpoint}", quantize="int8").translator()
    assert all(isinstance(m.output, Int8Linear) for m in ensemble.model.members)
    single, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None, "int8")
    cfg = SearchConfig(beam=3)
    for x, y in zip(
        translate(ensemble, SearchRequest(sources(toy_data_bin), cfg, 1000)),
        translate(single, SearchRequest(sources(toy_data_bin), cfg, 1000)),
    ):
        assert x[0].tokens == y[0].tokens and x[0].score == pytest.approx(y[0].score, abs=1e-5)


def test_each_step_scores_by_the_members_weighted_average(tiny_checkpoint, others, toy_data_bin):
    inference = opened(":".join(map(str, [tiny_checkpoint, *others])), weights="1,2,1")
    assert inference.weights == (0.25, 0.5, 0.25)
    ensemble = inference.translator().model
    assert isinstance(ensemble, Ensemble) and ensemble.weights == inference.weights
    assert ensemble.max_positions == 48  # the smallest member's
    assert [m.config.decoder_layers for m in inference.members] == [2, 2, 1]
    src = pad_sources([np.asarray(s, dtype=np.int64) for s in sources(toy_data_bin, 3)])
    k, rows = 2, torch.tensor([1, 1, 0, 3, 5, 4])  # each step's beams continue these rows
    with torch.inference_mode():
        enc = ensemble.encode(src, src.eq(PAD))
        cache = ensemble.init_cache(enc.select(torch.arange(3).repeat_interleave(k)), 1)
        own = [
            m.init_cache(m.encode(src, src.eq(PAD)).select(torch.arange(3).repeat_interleave(k)), 1)
            for m in ensemble.members
        ]
        prev = torch.full((3 * k,), BOS)
        for step in range(3):
            got, cache = ensemble.decode_step(prev, cache)
            steps = [m.decode_step(prev, c) for m, c in zip(ensemble.members, own)]
            expected = sum(w * lp for w, (lp, _) in zip(ensemble.weights, steps))
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
            assert not torch.equal(steps[0][0], steps[1][0])  # the members do differ
            cache, own = cache.select_rows(rows), [c.select_rows(rows) for _, c in steps]
            prev = got.argmax(-1)[rows]


def test_the_memory_refusal_counts_every_members_cache(tiny_checkpoint, others):
    """search/settings.py refuses search sizes whose cached keys and values cannot fit: an ensemble holds each
    member's."""
    one = opened(tiny_checkpoint).bounds
    assert one == search_bounds(read_saved_model(tiny_checkpoint).config, torch.device("cpu"), "fp32")
    two = opened(f"{tiny_checkpoint}:{others[1]}").bounds
    shaped = read_saved_model(others[1]).config
    per_step = one.decoder_layers * one.state_width + shaped.decoder_layers * 2 * shaped.d_model
    assert two.decoder_layers * two.state_width == per_step and two.max_positions == 48


def test_weights_are_normalised_and_checked(tiny_checkpoint):
    ensemble = f"{tiny_checkpoint}:{tiny_checkpoint}"
    assert opened(ensemble, weights="0.6,0.2").weights == pytest.approx((0.75, 0.25))
    assert opened(ensemble).weights == (0.5, 0.5)
    with pytest.raises(ConfigError, match="--weights has 3 value"):
        opened(ensemble, weights="1,1,1")
    with pytest.raises(ConfigError, match="--weights has 2 value.* for 1 checkpoint"):
        opened(tiny_checkpoint, weights="1,1")
    for bad in ("0,1", "-1,2", "x,1", "nan,1", "inf,1", "1e308,1e308", "", "1,,1"):
        with pytest.raises(ConfigError, match="--weights"):
            InferenceConfig(path=ensemble, weights=bad)
    r = nmt("generate", "--path", ensemble, "--weights", "1,-1", "--input", "-", input="1 2\n")
    assert r.exit_code == 1 and r.output.startswith("error: --weights '1,-1' must be positive"), r.output


def test_members_must_share_vocabulary_languages_and_task(tiny_checkpoint, toy_corpus, tmp_path):
    other_bin = tmp_path / "bin"
    preprocess(
        PreprocessConfig(
            source_lang="src",
            target_lang="tgt",
            trainpref=str(toy_corpus / "valid"),
            destdir=str(other_bin),
            vocab_size=20,
        )
    )
    spm = variant(tiny_checkpoint, tmp_path / "spm.pt", spm_model=(other_bin / SPM_FILE).read_bytes())
    r = nmt("generate", "--path", f"{tiny_checkpoint}:{spm}", "--input", "-", input="1 2\n")
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"error: {tiny_checkpoint} and {spm} have different sentencepiece models"), r.output
    langs = variant(tiny_checkpoint, tmp_path / "langs.pt", source_lang="tgt", target_lang="src")
    parser = variant(tiny_checkpoint, tmp_path / "parser.pt", target_format="ptb-tree")
    first = read_saved_model(tiny_checkpoint)
    with pytest.raises(CheckpointError, match=f"{tiny_checkpoint} and {langs} translate src->tgt and tgt->src"):
        check_members([first, read_saved_model(langs)])
    with pytest.raises(CheckpointError, match=f"{tiny_checkpoint} and {parser} do different tasks"):
        check_members([first, read_saved_model(parser)])
    check_members([first, first])


def test_paths_of_an_ensemble(tiny_checkpoint, tmp_path):
    r = nmt("generate", "--path", f"{tiny_checkpoint}:{tmp_path / 'none.pt'}", "--input", "-", input="1\n")
    assert r.exit_code == 1 and "none.pt does not exist" in r.output, r.output
    r = nmt("generate", "--path", f"{tiny_checkpoint}:", "--input", "-", input="1\n")
    assert r.exit_code == 1 and "has an empty checkpoint name" in r.output, r.output
    with pytest.raises(CheckpointError, match="names 2 checkpoints, an ensemble, which only generate and serve") as e:
        read_saved_model(Path(f"{tiny_checkpoint}:{tiny_checkpoint}"))  # the commands that read one checkpoint
    assert f"nmt average-checkpoints --inputs {tiny_checkpoint} {tiny_checkpoint}" in str(e.value)
    colon = tmp_path / "a:b.pt"  # a file whose name holds a colon is one checkpoint
    colon.write_bytes(tiny_checkpoint.read_bytes())
    assert opened(colon).others == ()


def test_generate_translates_with_an_ensemble(tiny_checkpoint, others, toy_data_bin, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("1 2 3\n4 5 6 7\n\n9\n")
    single = nmt("generate", "--path", tiny_checkpoint, "--input", src, "--output-format", "jsonl")
    twice = nmt(
        "generate", "--path", f"{tiny_checkpoint}:{tiny_checkpoint}", "--input", src, "--output-format", "jsonl"
    )
    assert single.exit_code == 0 and twice.exit_code == 0, twice.output
    assert twice.stdout == single.stdout
    split = [toy_data_bin, "--gen-subset", "valid", "--beam", "2", "--max-len-b", "6"]
    single = nmt("generate", *split, "--path", tiny_checkpoint)
    twice = nmt("generate", *split, "--path", f"{tiny_checkpoint}:{tiny_checkpoint}")
    assert single.exit_code == 0 and twice.exit_code == 0, twice.output
    assert twice.stdout == single.stdout and "H-49\t" in single.stdout
    mixed = nmt("generate", "--path", f"{tiny_checkpoint}:{others[1]}", "--weights", "0.7,0.3", "--input", src)
    assert mixed.exit_code == 0, mixed.output
    assert len(mixed.stdout.splitlines()) == 4


def test_an_ensembles_hypotheses_score_their_search_scores_and_align(tiny_checkpoint, others, toy_data_bin):
    """score-pairs and alignments pass through every member, weighted as the search's steps weigh them."""
    noisy, shaped = others
    translator = opened(f"{tiny_checkpoint}:{noisy}:{shaped}", weights="0.5,0.3,0.2").translator()
    search = replace(translator_search(tiny_checkpoint), beam=4, nbest=2, max_len_b=8)
    srcs = sources(toy_data_bin)
    results = translate(translator, SearchRequest(srcs, search, 64))
    pairs = [(s, h) for s, hyps in zip(srcs, results) for h in hyps if h.tokens]
    scored = forced_scores(translator, [s for s, _ in pairs], [np.array(h.tokens) for _, h in pairs], search, 64)
    for (_, h), p in zip(pairs, scored):
        assert p.score == pytest.approx(h.score, abs=1e-4)
    add_alignments(translator, srcs, results, hard=True, layer=0, max_tokens=64)  # `shaped` has one decoder layer
    for s, hyps in zip(srcs, results):
        for h in hyps:
            assert h.alignment is not None and h.alignment.weights.shape == (len(h.tokens), len(s))
            assert [t for _, t in h.alignment.pairs()] == list(range(len(h.tokens)))


def translator_search(path):
    return opened(path).search


def test_a_second_path_is_refused_not_taken_for_the_last(tiny_checkpoint, others, tmp_path):
    """Click keeps an option's last value; a second --path would silently translate with the other model alone."""
    noisy, _ = others
    text = tmp_path / "in.txt"
    text.write_text("1 2 3\n")
    result = nmt("generate", "--path", tiny_checkpoint, "--path", noisy, "--input", text, "--device", "cpu")
    assert result.exit_code == 2
    assert "'--path': given 2 times; give it once" in result.output and "--path A.pt:B.pt" in result.output
