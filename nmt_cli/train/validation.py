"""BLEU on the valid split during training, with the same search code and settings as `nmt generate`."""

from __future__ import annotations

import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import Vocab
from nmt_cli.metrics import sacrebleu_score
from nmt_cli.model.transformer import Transformer
from nmt_cli.runtime import DistInfo
from nmt_cli.search.translate import Translator, translate


def evaluate_bleu(
    model: Transformer,
    data: ParallelDataset,
    vocab: Vocab,
    cfg: SearchConfig,
    max_tokens: int,
    device: torch.device,
    amp_dtype: torch.dtype | None,
    info: DistInfo,
) -> float:
    """sacreBLEU of the valid split's translations against its detokenized references (rank 0 computes it)."""
    score = torch.zeros(1, dtype=torch.float64, device=device)
    if info.is_main:
        tr = Translator(model, vocab, device, amp_dtype)
        sources = [data.src[i] for i in range(len(data))]
        hyps = translate(tr, sources, cfg, max_tokens)
        refs = [vocab.decode(data.tgt[i]) for i in range(len(data))]
        score[0] = sacrebleu_score([vocab.decode(h[0].tokens) for h in hyps], [refs]).score
    if info.world_size > 1:
        import torch.distributed as dist

        dist.broadcast(score, src=0)
    return float(score[0])
