"""Beam search waits for the device once a step: counted on the CPU with tests/host_syncs.py's twin of
`torch.cuda.set_sync_debug_mode` (the GPU count is tests/test_gpu.py's)."""

from collections import Counter

import numpy as np
import pytest
import torch
from host_syncs import SyncLog

from nmt_cli.config import InferenceConfig, SearchConfig
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.search.lexical import LexicalConstraints
from nmt_cli.search.prefix import prefix_source
from nmt_cli.search.translate import SearchRequest, load_translator, open_for_inference, translate

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

# What a batch waits for besides its steps, as (call, function): collect() copies the finished hypotheses'
# tokens, step scores, lengths and scores to the host (four copies), and beam_steps reads the source lengths
# on the host (`src_lens.cpu()`: translate passes them from the host, so on CUDA this copies nothing).
# The twin does not see copies to the device: on CUDA a batch also sends its padded sources and its
# maximum lengths there (tests/test_gpu.py allows for them).
PER_BATCH = Counter({("cpu", "collect"): 4, ("cpu", "length_limits"): 1})
# The one wait of a step: int(done.sum()), how many sentences are done (beam_steps).
PER_STEP = ("__int__", "beam_steps")


def syncs_and_steps(translator, sources, cfg, constraints=None):
    """The waits of one translate call as (call, function), and the decoder steps it ran."""
    steps = []
    decode_step = translator.model.decode_step
    translator.model.decode_step = lambda *a: steps.append(1) or decode_step(*a)
    try:
        with SyncLog() as log:
            translate(translator, SearchRequest(sources, cfg, 10000, constraints=constraints))
    finally:
        del translator.model.decode_step
    return Counter((call, where.rsplit(" in ", 1)[1]) for call, where in log.syncs), len(steps)


def test_beam_search_waits_for_the_device_once_a_step(tiny_checkpoint, toy_data_bin):
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(30)]
    translator, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    for n in (10, 20):  # forced: exactly n + 1 steps, one batch
        syncs, steps = syncs_and_steps(translator, sources, SearchConfig(beam=4, max_len_a=0, max_len_b=n, min_len=n))
        assert steps == n + 1
        assert syncs == PER_BATCH + Counter({PER_STEP: n + 1}), syncs
    # Natural lengths: sentences finish at different steps and leave the batch (select_sentences).
    syncs, steps = syncs_and_steps(translator, sources, SearchConfig(beam=4))
    assert syncs == PER_BATCH + Counter({PER_STEP: steps}), syncs


def test_an_ensemble_waits_as_one_model_does(tiny_checkpoint, toy_data_bin):
    """Each member steps on its own cache, and their weighted sum takes the weights as host numbers: no wait."""
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(30)]
    cfg = InferenceConfig(path=f"{tiny_checkpoint}:{tiny_checkpoint}", weights="1,2", device="cpu")
    translator = open_for_inference(cfg, {}).translator()
    syncs, steps = syncs_and_steps(translator, sources, SearchConfig(beam=4, max_len_a=0, max_len_b=10, min_len=10))
    assert steps == 11
    assert syncs == PER_BATCH + Counter({PER_STEP: 11}), syncs
    syncs, steps = syncs_and_steps(translator, sources, SearchConfig(beam=4))
    assert syncs == PER_BATCH + Counter({PER_STEP: steps}), syncs


def test_prefixes_and_the_ngram_ban_add_no_wait(tiny_checkpoint, toy_data_bin):
    """Target prefixes composed with --no-repeat-ngram-size: their masks decide on the device."""
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(30)]
    prefixes = [source[: i % 4] for i, source in enumerate(sources)]
    translator, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    cfg = SearchConfig(beam=4, max_len_a=0, max_len_b=10, min_len=10, no_repeat_ngram_size=2)
    syncs, steps = syncs_and_steps(translator, sources, cfg, prefix_source(prefixes))
    assert steps == 11
    assert syncs == PER_BATCH + Counter({PER_STEP: 11}), syncs


def test_the_twin_sees_what_would_wait():
    x, idx = torch.arange(6.0), torch.tensor([1, 2])
    with SyncLog() as log:
        x[idx] = 3.0  # a Python number through tensor indices: a blocking copy to the device
        x[idx] = x.new_full((), 3.0)  # a device tensor: no wait
        x[x > 2]  # a boolean mask: a shape that depends on values
        x.nonzero()
        bool(x[0])
        x.repeat_interleave(torch.tensor([1, 1, 1, 1, 1, 2]))
        x[:, None].expand(-1, 2).reshape(-1)  # no wait
    assert [call for call, _ in log.syncs] == [
        "__setitem__",
        "__getitem__",
        "nonzero",
        "__bool__",
        "repeat_interleave",
    ]


def test_lexically_constrained_beam_search_waits_no_more(tiny_checkpoint, toy_data_bin):
    """Masks, candidates and banks (search/lexical.py) are all decided on the device."""
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(30)]
    translator, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    g = np.random.default_rng(0)
    phrases = [[g.integers(4, 20, g.integers(1, 4)).tolist() for _ in range(g.integers(0, 3))] for _ in sources]
    syncs, steps = syncs_and_steps(translator, sources, SearchConfig(beam=4), LexicalConstraints(phrases))
    assert syncs == PER_BATCH + Counter({PER_STEP: steps}), syncs
