"""Validation during training: loss, perplexity and (--eval-bleu) BLEU on the valid split, the last with the
same search code and settings as `nmt generate`; and what a validation changes, the best so far and patience.
A stop signal abandons a pass at once (the loop saves and stops; the resumed run validates again).
"""

from __future__ import annotations

import math

import torch

from nmt_cli.data.batching import batch_by_tokens, collate
from nmt_cli.metrics import sacrebleu_score
from nmt_cli.model.transformer import Transformer
from nmt_cli.search.translate import SearchRequest, Translator, translate
from nmt_cli.signals import Deferred, Interrupted
from nmt_cli.train.distributed import all_reduce_sum
from nmt_cli.train.loss import TranslationLoss
from nmt_cli.train.state import TrainState
from nmt_cli.train.trainer import Trainer


def validate(trainer: Trainer, signals: Deferred) -> dict[str, float] | None:
    """Loss, nll and perplexity (base e) on the valid split; sacreBLEU too with --eval-bleu; of the moving average of
    the weights with --ema-decay. Every rank calls it. None where a stop signal abandoned the pass on some rank
    (`Deferred.abandonable`): the ranks still meet in the pass's collectives, which tell every rank."""
    assert trainer.valid_data is not None
    model = trainer.ema.model if trainer.ema is not None else trainer.model
    model.eval()
    try:
        with torch.inference_mode():
            result = valid_loss(trainer, TranslationLoss(model, trainer.cfg.label_smoothing), signals)
            if result is not None and trainer.cfg.eval_bleu:
                bleu = evaluate_bleu(trainer, model, signals)
                result = None if bleu is None else {**result, "valid_bleu": bleu}
    finally:
        trainer.model.train()
    return result


def valid_loss(trainer: Trainer, objective: TranslationLoss, signals: Deferred) -> dict[str, float] | None:
    """The loss pass of `validate`, this rank's share of the batches; None where a signal abandoned it."""
    cfg, max_positions, info, data = trainer.cfg, trainer.model_cfg.max_positions, trainer.info, trainer.valid_data
    assert data is not None
    batches, _ = batch_by_tokens(
        data.src_lens.clip(max=max_positions - 1),
        data.tgt_lens.clip(max=max_positions - 1),
        max(cfg.max_tokens, max_positions),
        None,
    )
    totals = torch.zeros(4, dtype=torch.float64, device=trainer.device)  # loss, nll, tokens, ranks abandoned
    try:
        with signals.abandonable():
            for ids in batches[info.rank :: info.world_size]:
                batch = collate(data, ids, max_positions).to(trainer.device)
                loss, nll = trainer.batch_loss(batch, objective)
                totals[:2] += torch.stack([loss, nll]).double()
                totals[2] += batch.n_tgt_tokens
    except Interrupted:
        totals[3] = 1
    loss_sum, nll_sum, n_tokens, abandoned = all_reduce_sum(totals, info).tolist()
    if abandoned:
        return None
    return {
        "valid_loss": loss_sum / n_tokens,
        "valid_nll": nll_sum / n_tokens,
        "valid_ppl": math.exp(min(nll_sum / n_tokens, 100.0)),
    }


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


def evaluate_bleu(trainer: Trainer, model: Transformer, signals: Deferred) -> float | None:
    """sacreBLEU of `model`'s translations of the valid split against its detokenized references, with the search
    settings of --eval-bleu-* (rank 0 computes it); None where a signal abandoned the pass."""
    data, vocab, device = trainer.valid_data, trainer.vocab, trainer.device
    assert data is not None
    score = torch.zeros(1, dtype=torch.float64, device=device)
    if trainer.info.is_main:
        try:
            with signals.abandonable():
                translator = Translator(model, vocab, device, trainer.amp_dtype)
                sources = [data.src[i] for i in range(len(data))]
                request = SearchRequest(sources, trainer.search_cfg, trainer.cfg.eval_bleu_max_tokens)
                hyps = translate(translator, request)
                refs = [vocab.decode(data.tgt[i]) for i in range(len(data))]
                score[0] = sacrebleu_score([vocab.decode(h[0].tokens) for h in hyps], [refs]).score
        except Interrupted:
            score[0] = math.nan
    if trainer.info.world_size > 1:
        import torch.distributed as dist

        dist.broadcast(score, src=0)
    return None if math.isnan(score[0]) else float(score[0])
