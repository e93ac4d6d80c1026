"""The training loop: take the next update's batches, step, then log, validate and save on cadence.

Stopping rules (checked after every update and every epoch): --max-update, --max-epoch,
--max-time-minutes, --patience, and SIGINT/SIGTERM, which save checkpoint_last.pt and return.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nmt_cli.checkpoint import BEST, LAST, numbered_checkpoints, save_checkpoint
from nmt_cli.errors import NmtError
from nmt_cli.log import progress
from nmt_cli.train.distributed import broadcast_from_main
from nmt_cli.train.state import reset_flags
from nmt_cli.train.trainer import StepStats, Trainer

logger = logging.getLogger(__name__)


class Meter:
    """Averages of the updates since the last log line."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = self.seconds = self.grad_norm = 0.0
        self.n_tokens = self.n_updates = 0

    def add(self, s: StepStats) -> None:
        self.loss += s.loss * s.n_tokens
        self.nll += s.nll * s.n_tokens
        self.n_tokens += s.n_tokens
        self.seconds += s.seconds
        self.grad_norm += s.grad_norm
        self.n_updates += 1

    def summary(self) -> dict[str, float]:
        n = max(self.n_tokens, 1)
        nll = self.nll / n
        return {
            "loss": self.loss / n,
            "nll_loss": nll,
            "ppl": math.exp(min(nll, 100.0)),
            "tgt_tok_per_s": self.n_tokens / max(self.seconds, 1e-9),
            "grad_norm": self.grad_norm / max(self.n_updates, 1),
        }


class Session:
    """The loop's mutable surroundings: signals, meters, clock, log file."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.meter = Meter()
        self.signal: int | None = None
        self.saved_at = -1  # update of the last checkpoint_last.pt written by this run
        self.clock_start = time.monotonic()
        self.elapsed_start = trainer.state.elapsed
        log_file = trainer.cfg.log_file
        self.log_path = Path(log_file) if log_file and trainer.info.is_main else None
        self.last_train: dict[str, float] = {}  # the latest train log line, for the progress bar

    def tick(self) -> int:
        """Advance the run's clock and read the signal flag; returns the signal that stops the run, or 0.

        With several ranks every rank takes rank 0's clock and flag (one collective), so that what is
        decided from them (timed saves, --max-time-minutes, stopping for a signal) is decided alike on
        every rank: ranks on their own clocks could stop at different updates, one waiting for the other.
        """
        own = self.elapsed_start + time.monotonic() - self.clock_start
        elapsed, signalled = broadcast_from_main([own, float(self.signal or 0)], self.trainer.info, self.trainer.device)
        self.trainer.state.elapsed = elapsed
        return int(signalled)

    def emit(self, event: str, values: dict[str, Any]) -> None:
        if not self.trainer.info.is_main:
            return
        s = self.trainer.state
        record = {
            "event": event,
            "update": s.update,
            "epoch": s.logged_epoch,
            "elapsed_s": round(s.elapsed, 1),
            **values,
        }
        text = " | ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items() if k != "event"
        )
        logger.info("%s | %s", event, text)
        if self.log_path:
            try:
                with self.log_path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
            except OSError as e:
                raise NmtError(f"cannot write --log-file {self.log_path}: {e.strerror}") from None

    @contextmanager
    def signals(self) -> Iterator[None]:
        def handler(signum: int, frame: Any) -> None:
            self.signal = signum

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)


def save(trainer: Trainer, numbered: bool, best: bool) -> None:
    """checkpoint_last.pt always; checkpoint_<update>.pt and checkpoint_best.pt when asked. Rank 0 only."""
    rng = trainer.rng_states()  # every rank's random streams, gathered: a collective, so before the rank check
    if not trainer.info.is_main:
        return
    save_dir = Path(trainer.cfg.save_dir)
    update = trainer.state.update
    state = trainer.checkpoint(rng)
    # checkpoint_last.pt goes last: a run killed in between resumes from the previous update and rewrites
    # the others, so the numbered and best files of every update that checkpoint_last.pt has passed exist.
    kept = "the previous checkpoint is intact"
    if numbered:
        save_checkpoint(state, save_dir / f"checkpoint_{update}.pt", kept)
    if best:
        save_checkpoint(state, save_dir / BEST, kept)
    save_checkpoint(state, save_dir / LAST, kept)
    if numbered and trainer.cfg.keep_last:
        for old in numbered_checkpoints(save_dir)[: -trainer.cfg.keep_last]:
            old.unlink()
    logger.info(
        "saved %s at update %d%s%s",
        LAST,
        update,
        f" and checkpoint_{update}.pt" if numbered else "",
        f" and {BEST}" if best else "",
    )


def validate_and_save(session: Session, numbered: bool) -> int:
    """Validate (when there is a valid split), then save checkpoint_last.pt, checkpoint_best.pt when it is
    the best, and the numbered copy when asked or when a stopping rule now holds (the run's last save,
    made here rather than a second time after the loop). Returns the signal that stops the run, or 0."""
    t = session.trainer
    best = False
    if t.valid_data is not None:
        result = t.validate()
        best = t.record_validation(result)
        session.emit("valid", {**result, "best": t.state.best})
    signalled = session.tick()
    save(t, numbered=numbered or t.stop_reason() is not None, best=best)
    session.saved_at = t.state.update
    return signalled


def after_update(session: Session, stats: StepStats | None) -> int:
    """Log, then validate and save as due. Returns the signal that stops every rank, or 0.

    The ranks agree on the clock and on signals in the update's one collective (`Session.tick`).
    """
    t, c, s = session.trainer, session.trainer.cfg, session.trainer.state
    signalled = session.tick()
    if stats is not None:
        session.meter.add(stats)
    if stats is not None and s.update % c.log_interval == 0:
        session.last_train = session.meter.summary()
        overflows = {"fp16_overflows": s.n_overflows} if t.scaler else {}
        session.emit("train", {**session.last_train, "lr": t.lr(s.update), "skipped": s.n_skipped_updates, **overflows})
        session.meter.reset()
    timed = bool(c.save_interval_minutes) and s.elapsed - s.last_timed_save >= c.save_interval_minutes * 60
    if timed:
        s.last_timed_save = s.elapsed
    by_updates = bool(stats) and bool(c.save_interval_updates) and s.update % c.save_interval_updates == 0
    validate = bool(stats) and bool(c.validate_interval_updates) and s.update % c.validate_interval_updates == 0
    if timed or by_updates or validate:
        signalled = validate_and_save(session, numbered=timed or by_updates) or signalled
    return signalled


def progress_fields(session: Session) -> dict[str, Any]:
    """The bar counts updates toward --max-update, else minutes toward --max-time-minutes."""
    c, s = session.trainer.cfg, session.trainer.state
    info = f"epoch {s.epoch}"
    if session.last_train:
        info += f" | loss {session.last_train['loss']:.3f} | {session.last_train['tgt_tok_per_s']:,.0f} tok/s"
    if c.max_update or not c.max_time_minutes:
        return {"description": "updates", "completed": s.update, "total": c.max_update or None, "info": info}
    return {
        "description": "minutes",
        "completed": round(s.elapsed / 60, 1),
        "total": c.max_time_minutes,
        "info": f"update {s.update} | {info}",
    }


def train_loop(trainer: Trainer) -> int:
    """Train until a stopping rule holds; always leaves an up-to-date checkpoint_last.pt. Returns the signal
    (SIGINT, SIGTERM) that stopped the run, or 0: the command then exits 128 + it, as an interrupted
    program does, so that a script (a recipe, a job) stops instead of going on with a half-trained model."""
    r = Session(trainer)
    s, c = trainer.state, trainer.cfg
    with r.signals(), progress() as bar:
        task = bar.add_task("train", total=None, completed=0, info="")
        reason = None
        while reason is None:
            batches = trainer.epoch_batches()
            if s.batch_in_epoch >= len(batches):  # end of epoch: the checkpoint points at the next one
                logger.info("end of epoch %d", s.epoch)
                s.next_epoch()
                signalled = validate_and_save(r, numbered=False)
            else:
                group = batches[s.batch_in_epoch : s.batch_in_epoch + c.update_freq]
                stats = trainer.train_step(group)
                s.consume_batches(len(group))
                signalled = after_update(r, stats)
                bar.update(task, **progress_fields(r))
            reason = trainer.stop_reason()
            if signalled:
                resets = reset_flags(c)
                again = f"the same command without {', '.join(resets)}" if resets else "the same command"
                reason = f"stopped by {signal.Signals(signalled).name}; {again} resumes"
    if r.saved_at != s.update:  # else saved at this update already, numbered where a stopping rule holds
        if signalled:
            save(trainer, numbered=False, best=False)
        else:
            validate_and_save(r, numbered=True)
    logger.info("training ended at update %d, epoch %d after %.0f s: %s", s.update, s.logged_epoch, s.elapsed, reason)
    return signalled
