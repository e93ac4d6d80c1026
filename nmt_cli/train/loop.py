"""The training loop: take the next update's batches, step, then log, validate and save on cadence, until a
stopping rule (Trainer.stop_reason) holds or SIGINT/SIGTERM comes, which saves checkpoint_last.pt and returns.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from pathlib import Path
from typing import Any

from nmt_cli.checkpoint import BEST, LAST, numbered_checkpoints, save_checkpoint
from nmt_cli.errors import ConfigError, NmtError
from nmt_cli.log import progress
from nmt_cli.signals import Deferred, deferred_signals, signal_name
from nmt_cli.train.distributed import broadcast_from_main
from nmt_cli.train.epoch_plan import EpochPlan, plan_epoch
from nmt_cli.train.trainer import StepStats, Trainer
from nmt_cli.train.validation import record_validation, validate

logger = logging.getLogger(__name__)


class Meter:
    """Averages of the updates since the last log line."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.nll = self.seconds = self.grad_norm = 0.0
        self.n_tokens = self.n_updates = 0

    def add(self, stats: StepStats) -> None:
        self.loss += stats.loss * stats.n_tokens
        self.nll += stats.nll * stats.n_tokens
        self.n_tokens += stats.n_tokens
        self.seconds += stats.seconds
        self.grad_norm += stats.grad_norm
        self.n_updates += 1

    def summary(self) -> dict[str, float]:
        n_tokens = max(self.n_tokens, 1)
        nll = self.nll / n_tokens
        return {
            "loss": self.loss / n_tokens,
            "nll_loss": nll,
            "ppl": math.exp(min(nll, 100.0)),
            "tgt_tok_per_s": self.n_tokens / max(self.seconds, 1e-9),
            "grad_norm": self.grad_norm / max(self.n_updates, 1),
        }


class Session:
    """The loop's mutable surroundings: the deferred signals, meters, clock, log file."""

    def __init__(self, trainer: Trainer, signals: Deferred) -> None:
        self.trainer = trainer
        self.signals = signals
        self.meter = Meter()
        self.saved_at = -1  # update of the last checkpoint_last.pt written by this run
        self.clock_start = time.monotonic()
        self.elapsed_start = trainer.state.elapsed
        log_file = trainer.cfg.log_file
        self.log_path = Path(log_file) if log_file and trainer.info.is_main else None
        self.last_train: dict[str, float] = {}  # the latest train log line, for the progress bar
        self.board = tensorboard_writer(trainer)

    def tick(self) -> int:
        """Advance the run's clock and read the signal flag; returns the signal that stops the run, or 0. Every rank
        takes rank 0's clock and flag (one collective), so that timed saves, --max-time-minutes and stopping for a
        signal are decided alike on every rank, none stopping at another update than the others."""
        own = self.elapsed_start + time.monotonic() - self.clock_start
        flag = float(self.signals.received)
        elapsed, signalled = broadcast_from_main([own, flag], self.trainer.info, self.trainer.device)
        self.trainer.state.elapsed = elapsed
        return int(signalled)

    def emit(self, event: str, values: dict[str, Any]) -> None:
        if not self.trainer.info.is_main:
            return
        state = self.trainer.state
        record = {
            "event": event,
            "update": state.update,
            "epoch": state.logged_epoch,
            "elapsed_s": round(state.elapsed, 1),
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
        if self.board is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):  # "train/loss", "valid/bleu", ...
                    self.board.add_scalar(f"{event}/{key.removeprefix(event + '_')}", value, state.update)
            self.board.flush()  # each record on disk as the JSON log's is, whatever stops the run later


def tensorboard_writer(trainer: Trainer) -> Any:
    """--tensorboard-logdir's SummaryWriter on rank 0, else None. The step is the update: a resumed run's curves go
    on, the points a killed run logged past its checkpoint hidden (purge_step)."""
    logdir, update = trainer.cfg.tensorboard_logdir, trainer.state.update
    if not logdir or not trainer.info.is_main:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--tensorboard-logdir needs tensorboard: pip install 'nmt[tensorboard]'") from None
    try:
        return SummaryWriter(logdir, purge_step=update + 1 if update else None)
    except OSError as e:
        raise NmtError(f"cannot write --tensorboard-logdir {logdir}: {e.strerror}") from None


def save(trainer: Trainer, numbered: bool, best: bool) -> None:
    """checkpoint_last.pt always; checkpoint_<update>.pt and checkpoint_best.pt when asked. Rank 0 only."""
    rng = trainer.rng_states()  # every rank's random streams, gathered: a collective, so before the rank check
    if not trainer.info.is_main:
        return
    save_dir = Path(trainer.cfg.save_dir)
    update = trainer.state.update
    checkpoint = trainer.checkpoint(rng)
    # checkpoint_last.pt goes last: a run killed in between resumes from the previous update and rewrites
    # the others, so the numbered and best files of every update that checkpoint_last.pt has passed exist.
    kept = "the previous checkpoint is intact"
    if numbered:
        save_checkpoint(checkpoint, save_dir / f"checkpoint_{update}.pt", kept)
    if best:
        save_checkpoint(checkpoint, save_dir / BEST, kept)
    save_checkpoint(checkpoint, save_dir / LAST, kept)
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
    trainer = session.trainer
    best = False
    if trainer.valid_data is not None:
        result = validate(trainer, session.signals)
        if result is None:  # a signal abandoned it: save the last update's state, which validates again on resume
            trainer.state.abandon_validation(numbered)
            save(trainer, numbered=False, best=False)
            session.saved_at = trainer.state.update
            return session.tick() or signal.SIGTERM  # SIGTERM: a signal that reached another rank only
        best = record_validation(trainer.state, trainer.cfg.best_checkpoint_metric, result)
        session.emit("valid", {**result, "best": trainer.state.best})
    trainer.state.validated()
    signalled = session.tick()
    save(trainer, numbered=numbered or trainer.stop_reason() is not None, best=best)
    session.saved_at = trainer.state.update
    return signalled


def after_update(session: Session, stats: StepStats | None) -> int:
    """Log, then validate and save as due. Returns the signal that stops every rank, or 0 (`Session.tick`)."""
    trainer, cfg, state = session.trainer, session.trainer.cfg, session.trainer.state
    signalled = session.tick()
    if stats is not None:
        session.meter.add(stats)
    if stats is not None and state.update % cfg.log_interval == 0:
        session.last_train = session.meter.summary()
        overflows = {"fp16_overflows": state.n_overflows} if trainer.scaler else {}
        lr = trainer.lr(state.update)
        session.emit("train", {**session.last_train, "lr": lr, "skipped": state.n_skipped_updates, **overflows})
        session.meter.reset()
    timed = bool(cfg.save_interval_minutes) and state.elapsed - state.last_timed_save >= cfg.save_interval_minutes * 60
    if timed:
        state.last_timed_save = state.elapsed
    by_updates = bool(stats) and bool(cfg.save_interval_updates) and state.update % cfg.save_interval_updates == 0
    validating = (
        bool(stats) and bool(cfg.validate_interval_updates) and state.update % cfg.validate_interval_updates == 0
    )
    if timed or by_updates or validating:
        signalled = validate_and_save(session, numbered=timed or by_updates) or signalled
    return signalled


def progress_fields(session: Session) -> dict[str, Any]:
    """The bar counts updates toward --max-update, else minutes toward --max-time-minutes."""
    cfg, state = session.trainer.cfg, session.trainer.state
    info = f"epoch {state.epoch}"
    if session.last_train:
        info += f" | loss {session.last_train['loss']:.3f} | {session.last_train['tgt_tok_per_s']:,.0f} tok/s"
    if cfg.max_update or not cfg.max_time_minutes:
        return {"description": "updates", "completed": state.update, "total": cfg.max_update or None, "info": info}
    return {
        "description": "minutes",
        "completed": round(state.elapsed / 60, 1),
        "total": cfg.max_time_minutes,
        "info": f"update {state.update} | {info}",
    }


def train_loop(trainer: Trainer) -> int:
    """Train until a stopping rule holds; always leaves an up-to-date checkpoint_last.pt. Returns the signal
    (SIGINT, SIGTERM) that stopped the run, or 0 (commands/train.py: Stopped.exit_status).

    Signals stay deferred until the last save has finished (signals.py): a further one says so on one line and is
    otherwise ignored, so a save that has started is never cut short (a signal in the last save of a run that
    stopped by its own rules is still answered)."""
    state = trainer.state
    waiting = f"stopping once {LAST} is saved; please wait" if trainer.info.is_main else ""
    with deferred_signals(waiting) as signals:
        session = Session(trainer, signals)
        try:
            reason, signalled = run_updates(session)
        finally:
            trainer.loader.close()  # no batch is prepared past the last update
        if session.saved_at != state.update:  # else saved at this update already, numbered where a rule holds
            if signalled:
                save(trainer, numbered=False, best=False)
            else:
                validate_and_save(session, numbered=True)
        if session.board is not None:
            session.board.close()
    ended = f"training ended at update {state.update}, epoch {state.logged_epoch} after {state.elapsed:.0f} s"
    logger.info("%s: %s", ended, reason)
    return signalled or signals.received


def run_updates(session: Session) -> tuple[str, int]:
    """Update, validating and saving on cadence, until a stopping rule holds or a signal came; returns why the
    run stops and the signal (or 0)."""
    trainer, state = session.trainer, session.trainer.state
    plan: EpochPlan | None = None
    reason = None
    signalled = 0
    with progress() as bar:
        task = bar.add_task("train", total=None, completed=0, info="")
        while reason is None:
            if state.validation_due:  # abandoned for a signal by the run that saved the checkpoint
                signalled = validate_and_save(session, numbered=state.numbered_due)
            else:
                plan, signalled = advance(session, plan)
                bar.update(task, **progress_fields(session))
            reason = trainer.stop_reason()
            if signalled:
                reason = f"stopped by {signal_name(signalled)}; the same command resumes"
    return reason, signalled


def advance(session: Session, plan: EpochPlan | None) -> tuple[EpochPlan, int]:
    """One update, or the end of the epoch; returns the epoch's plan (made once, where the loop reaches the epoch)
    and the signal that stops the run, or 0."""
    trainer, state, cfg = session.trainer, session.trainer.state, session.trainer.cfg
    if plan is None or plan.epoch != state.epoch:
        plan = plan_epoch(
            trainer.train_data,
            cfg,
            max_positions=trainer.model_cfg.max_positions,
            info=trainer.info,
            epoch=state.epoch,
            report_padding=plan is None,
        )
    if plan.finished(state.batch_in_epoch):  # end of epoch: the checkpoint points at the next one
        logger.info("end of epoch %d", state.epoch)
        state.next_epoch()
        return plan, validate_and_save(session, numbered=False)
    group = plan.update_batches(state.batch_in_epoch, cfg.update_freq)
    stats = trainer.train_step(group, plan)
    state.consume_batches(len(group))
    return plan, after_update(session, stats)
