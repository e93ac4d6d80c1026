"""Searches that advance one decoder step per resumption (serve's worker interleaves two batches): two of them
resumed in turn on one thread get what each gets alone, each step in its own translator's precision."""

import numpy as np
import pytest
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.dataset import load_vocab
from nmt_cli.search.translate import SearchRequest, Translator, translate, translate_steps

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

SOURCES = [np.array(s) for s in ([5, 6, 7], [8, 9, 10, 11, 12], [4])]
OTHERS = [np.array(s) for s in ([13, 14, 15, 16], [17, 18], [6, 6, 6, 6, 6, 6])]


def counting(search, steps):
    """Run a stepping search to its end, steps[0] counting its resumptions as they go (for callbacks to read)."""
    while True:
        try:
            next(search)
        except StopIteration as stop:
            return stop.value
        steps[0] += 1


def in_turn(*searches):
    """Resume the searches one after another until each has ended; their results, and the steps each ran."""
    results, steps, live = [None] * len(searches), [0] * len(searches), list(range(len(searches)))
    while live:
        for i in list(live):
            try:
                next(searches[i])
                steps[i] += 1
            except StopIteration as stop:
                results[i] = stop.value
                live.remove(i)
            assert not torch.is_autocast_enabled("cpu")  # no step leaves its precision to the next
    return results, steps


@pytest.mark.parametrize(
    "cfg",
    [
        SearchConfig(beam=4, nbest=2, max_len_a=0, max_len_b=8),
        SearchConfig(beam=1, max_len_a=0, max_len_b=8),
        SearchConfig(sampling=True, beam=1, nbest=2, seed=3, max_len_a=0, max_len_b=8),
    ],
    ids=["beam", "greedy", "sampling"],
)
def test_two_searches_resumed_in_turn_get_what_each_gets_alone(tiny_model, toy_data_bin, cfg):
    vocab = load_vocab(toy_data_bin)
    fp32 = Translator(tiny_model, vocab, torch.device("cpu"))
    bf16 = Translator(tiny_model, vocab, torch.device("cpu"), torch.bfloat16)
    alone = [translate(fp32, SearchRequest(SOURCES, cfg, 1000)), translate(bf16, SearchRequest(OTHERS, cfg, 1000))]
    together, steps = in_turn(
        translate_steps(fp32, SearchRequest(SOURCES, cfg, 1000)),
        translate_steps(bf16, SearchRequest(OTHERS, cfg, 1000)),
    )
    assert together == alone
    assert min(steps) > 1  # both ran step by step, interleaved
    assert alone[0] != translate(bf16, SearchRequest(SOURCES, cfg, 1000))  # the precision shows in the hypotheses


def test_the_encoder_runs_a_layer_per_resumption(tiny_model, toy_data_bin):
    """A batch of long sentences does not hold the worker for its whole encoder: the search pauses after each
    encoder layer before its first decoder step, and the layers' output is `encode`'s."""
    vocab = load_vocab(toy_data_bin)
    translator = Translator(tiny_model, vocab, torch.device("cpu"))
    cfg = SearchConfig(beam=2, min_len=3, max_len_a=0, max_len_b=3)  # exactly 3 tokens and EOS: 4 decoder steps
    results, steps = in_turn(translate_steps(translator, SearchRequest(SOURCES, cfg, 1000)))
    assert results == [translate(translator, SearchRequest(SOURCES, cfg, 1000))]
    assert steps == [len(tiny_model.encoder) + 3]  # a pause after each layer and each step but the last
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]])
    with torch.inference_mode():
        layered = tiny_model.encode_steps(src, src.eq(1))
        for _ in tiny_model.encoder:
            next(layered)
        with pytest.raises(StopIteration) as stop:
            next(layered)
        assert torch.equal(stop.value.value.memory, tiny_model.encode(src, src.eq(1)).memory)


def test_a_sentence_is_told_as_it_finishes_with_the_hypotheses_the_search_returns(tiny_model, toy_data_bin):
    """`on_done` (serve's early answers): a sentence that finishes before its batch's last step is told once, at
    the step it finishes, with exactly the hypotheses the search then returns for it."""
    vocab = load_vocab(toy_data_bin)
    translator = Translator(tiny_model, vocab, torch.device("cpu"))
    sources = [np.arange(4, 4 + n) for n in (1, 3, 6, 9)]
    cfg = SearchConfig(beam=3, nbest=2, min_len=1, max_len_a=1, max_len_b=1)  # at most 2, 4, 7 and 10 pieces
    told, steps = [], [0]
    search = translate_steps(
        translator, SearchRequest(sources, cfg, 1000), on_done=lambda i, hyps: told.append((i, steps[0], hyps))
    )
    results = counting(search, steps)
    assert results == translate(translator, SearchRequest(sources, cfg, 1000))
    assert [i for i, _, _ in told] == sorted({i for i, _, _ in told})  # each once, the shortest first here
    assert all(hyps == results[i] for i, _, hyps in told)
    assert told and told[0][0] == 0 and told[0][1] < steps[0] - 3  # the one-piece source, well before the end
    longest = max(range(len(sources)), key=lambda i: len(results[i][0].tokens))
    assert longest not in {i for i, _, _ in told}  # the last to finish comes with the batch's end
