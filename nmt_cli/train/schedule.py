"""Learning-rate schedules: the paper's `noam` (§5.3) and fairseq's `inverse_sqrt`."""

from __future__ import annotations

INVERSE_SQRT_PEAK = 5e-4  # inverse_sqrt's peak lr where --lr is not given (fairseq's transformer recipes)


def learning_rate(
    update: int, scheduler: str, d_model: int, warmup: int, lr_scale: float, peak_lr: float | None
) -> float:
    """The learning rate for update number `update` (1-based).

    noam:         lr_scale * d_model^-0.5 * min(update^-0.5, update * warmup^-1.5)
    inverse_sqrt: peak_lr * min(update / warmup, (warmup / update)^0.5), peak_lr None: INVERSE_SQRT_PEAK
    Both peak at update == warmup.
    """
    step = max(update, 1)
    if scheduler == "noam":
        return lr_scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    if scheduler == "inverse_sqrt":
        peak = INVERSE_SQRT_PEAK if peak_lr is None else peak_lr
        return peak * min(step / warmup, (warmup / step) ** 0.5)
    raise ValueError(f"unknown scheduler {scheduler}")
