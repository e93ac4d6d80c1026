"""Validation during training: loss, perplexity and (--eval-bleu) BLEU on the valid split, the last with the
same search code and settings as `nmt generate`; and what a validation changes, the best so far and patience.
"""

from __future__ import annotations

import math

import torch

from nmt_cli.config import SearchConfig
from nmt_cli.data.batching import batch_by_tokens, collate
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.data.vocab import Vocab
from nmt_cli.metrics import sacrebleu_score
from nmt_cli.model.transformer import Transformer
from nmt_cli.runtime import DistInfo
from nmt_cli.search.translate import Translator, translate
from nmt_cli.train.distributed import all_reduce_sum
from nmt_cli.train.state import TrainState
from nmt_cli.train.trainer import Trainer


@torch.inference_mode()
def validate(trainer: Trainer) -> dict[str, float]:
    """Loss, nll and perplexity (base e) on the valid split; sacreBLEU too with --eval-bleu. Every rank calls it."""
    assert trainer.valid_data is not None
    cfg, max_positions, info = trainer.cfg, trainer.model_cfg.max_positions, trainer.info
    trainer.model.eval()
    data = trainer.valid_data
    batches, _ = batch_by_tokens(
        data.src_lens.clip(max=max_positions - 1),
        data.tgt_lens.clip(max=max_positions - 1),
        max(cfg.max_tokens, max_positions),
        None,
    )
    totals = torch.zeros(3, dtype=torch.float64, device=trainer.device)
    for ids in batches[info.rank :: info.world_size]:
        batch = collate(data, ids, max_positions).to(trainer.device)
        loss, nll = trainer.batch_loss(batch)
        totals[:2] += torch.stack([loss, nll]).double()
        totals[2] += batch.n_tgt_tokens
    loss_sum, nll_sum, n_tokens = all_reduce_sum(totals, info).tolist()
    result = {
        "valid_loss": loss_sum / n_tokens,
        "valid_nll": nll_sum / n_tokens,
        "valid_ppl": math.exp(min(nll_sum / n_tokens, 100.0)),
    }
    if cfg.eval_bleu:
        result["valid_bleu"] = evaluate_bleu(
            trainer.model,
            data,
            trainer.vocab,
            trainer.search_cfg,
            cfg.eval_bleu_max_tokens,
            trainer.device,
            trainer.amp_dtype,
            info,
        )
    trainer.model.train()
    return result


def record_validation(state: TrainState, metric: str, result: dict[str, float]) -> bool:
    """Update the best so far and the validations without improvement (--patience) by `metric`
    (--best-checkpoint-metric); True when this validation is the best so far."""
    value = result["valid_bleu"] if metric == "bleu" else result["valid_loss"]
    improved = state.best is None or (value > state.best if metric == "bleu" else value < state.best)
    if improved:
        state.best, state.bad_validations = value, 0
    else:
        state.bad_validations += 1
    return improved


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
        translator = Translator(model, vocab, device, amp_dtype)
        sources = [data.src[i] for i in range(len(data))]
        hyps = translate(translator, sources, cfg, max_tokens)
        refs = [vocab.decode(data.tgt[i]) for i in range(len(data))]
        score[0] = sacrebleu_score([vocab.decode(h[0].tokens) for h in hyps], [refs]).score
    if info.world_size > 1:
        import torch.distributed as dist

        dist.broadcast(score, src=0)
    return float(score[0])
