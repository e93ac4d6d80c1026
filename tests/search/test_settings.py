"""search/settings.py's refusal of search sizes that cannot fit: the memory one sentence's search needs."""

import pytest
import torch

from nmt_cli.config import SearchConfig
from nmt_cli.errors import ConfigError
from nmt_cli.search import settings
from nmt_cli.search.beam import max_lengths
from nmt_cli.search.settings import SearchBounds, available_memory, search_memory, search_settings

pytestmark = pytest.mark.usefixtures("cpu_matmul_route")  # both CPU matmul routes on every machine (conftest.py)

# transformer_base's decoder: 6 layers, keys and values 512 wide each, 37,000 pieces, 1,024 positions, fp32
BASE = SearchBounds(37_000, 6, 1024, 1024, 4, torch.device("cpu"))


def test_the_estimate_counts_each_rows_cache_scores_and_hypotheses_at_the_shortest_inputs_limit():
    steps = 1 + 50 + 1  # a * 1 + b pieces for a one-piece input, and EOS
    per_row = 6 * steps * 1024 * 4 + 37_000 * 4 + 2 * steps * 12
    assert search_memory(SearchConfig(beam=4), BASE) == 4 * per_row
    assert search_memory(SearchConfig(beam=4, nbest=3, sampling=True), BASE) == 3 * per_row  # a row per sample
    # the length is the model's at most, however large --max-len-b is
    long = SearchConfig(beam=2, max_len_b=10**30)
    assert search_memory(long, BASE) == 2 * (6 * 1024 * 1024 * 4 + 37_000 * 4 + 2 * 1024 * 12)
    half = SearchBounds(37_000, 6, 1024, 1024, 2, torch.device("cpu"))  # bf16 or fp16 keys and values
    assert search_memory(SearchConfig(beam=4), half) == 4 * (6 * steps * 1024 * 2 + 37_000 * 4 + 2 * steps * 12)


def test_a_size_over_the_available_memory_is_refused_naming_the_option(monkeypatch):
    need = search_memory(SearchConfig(beam=8), BASE)
    monkeypatch.setattr(settings, "available_memory", lambda device: need)
    assert search_settings("ck.pt", SearchConfig(), {"beam": 8}, False, BASE).beam == 8  # just fits
    with pytest.raises(ConfigError, match=r"^--beam 9 cannot fit: .* cpu has .* available; give a smaller --beam$"):
        search_settings("ck.pt", SearchConfig(), {"beam": 9}, False, BASE)
    with pytest.raises(ConfigError, match=r"^--nbest 9 cannot fit: .* 9 samples "):
        search_settings("ck.pt", SearchConfig(), {"sampling": True, "nbest": 9}, False, BASE)
    monkeypatch.setattr(settings, "available_memory", lambda device: None)  # a device of unknown memory
    assert search_settings("ck.pt", SearchConfig(), {"beam": 10**9}, False, BASE).beam == 10**9


def test_the_cpus_available_memory_is_read():
    have = available_memory(torch.device("cpu"))
    assert have is not None and have > 2**20


def test_absurd_length_limits_reach_the_models_positions_instead_of_overflowing():
    """--max-len-b 10**30 had raised OverflowError, and --max-len-a 1e300 or --max-len-b 2**63 - 1 had wrapped
    round to a negative length: one-piece outputs."""
    lens = torch.tensor([0, 3, 1000])
    for cfg in (SearchConfig(max_len_b=10**30), SearchConfig(max_len_a=1e300), SearchConfig(max_len_b=2**63 - 1)):
        assert max_lengths(lens, cfg, 256).tolist() == [min(cfg.max_len_b, 255), 255, 255]
