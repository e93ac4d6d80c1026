"""The `nmt` command: a click group whose subcommands each live in their own module of this package.

The only package that imports click. Errors the user can fix (NmtError) become one red `error:` line and exit 1;
click's usage errors exit 2; `--debug` shows tracebacks. Nothing here imports torch, so `--help` and argument errors
answer at once. Ctrl-C at any moment, an `import torch` included, is one `error: interrupted` line, exit 130.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

from nmt_cli import __version__
from nmt_cli.allocator import tune_allocator
from nmt_cli.cli.average import average_checkpoints
from nmt_cli.cli.export import export
from nmt_cli.cli.generate import generate
from nmt_cli.cli.options import CONTEXT, configurable
from nmt_cli.cli.output import StdoutError, finish_stdout, guard_stdout
from nmt_cli.cli.plot import plot
from nmt_cli.cli.preprocess import preprocess
from nmt_cli.cli.score import score
from nmt_cli.cli.score_pairs import score_pairs
from nmt_cli.cli.serve import serve
from nmt_cli.cli.train import train
from nmt_cli.errors import INTERRUPTED_STATUS, NmtError, quit_on_ctrl_c, raise_on_ctrl_c
from nmt_cli.log import print_error, setup_logging
from nmt_cli.signals import Interrupted


def stop_interrupted() -> NoReturn:
    """Ctrl-C in a command's work, where the command does not handle it itself: one error line and exit 130. A
    second Ctrl-C while the line is printed is ignored, so that it cannot become a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print_error("interrupted")
    sys.exit(INTERRUPTED_STATUS)


class NmtGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # before click turns it into "Aborted!" and exit 1
            stop_interrupted()
        except (NmtError, Interrupted) as e:
            if ctx.params.get("debug"):
                raise
            print_error(str(e))
            ctx.exit(getattr(e, "exit_code", 1))  # 1, or 128 + the signal that stopped a write (Interrupted)
        except BrokenPipeError:  # `nmt generate ... | head`: the reader has gone, so stop quietly
            # no second error at exit; stdout may have no file descriptor (tests)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(1)


@click.group(cls=NmtGroup, context_settings={**CONTEXT, "auto_envvar_prefix": "NMT"})  # NMT_SERVE_PORT=...
@click.version_option(__version__, prog_name="nmt")
@click.option("-q", "--quiet", is_flag=True, help="Warnings and errors only.")
@click.option(
    "--no-progress", is_flag=True, help="No progress bars (they are off anyway when stderr is not a terminal)."
)
@click.option("--debug", is_flag=True, help="Show tracebacks for user errors too.")
def cli(quiet: bool, no_progress: bool, debug: bool) -> None:
    """Neural machine translation with the Transformer of "Attention Is All You Need".

    Pipeline: preprocess -> train -> average-checkpoints -> generate -> score; score-pairs scores given
    translations with a model, serve over HTTP, export for other engines, plot to see.
    """
    setup_logging(quiet, progress=not no_progress)


def start_command(callback: Callable[..., Any]) -> Callable[..., Any]:
    """`callback`, run once its subcommand's arguments are parsed (so that `--help` and usage errors import no
    torch): the command's modules are imported while Ctrl-C still quits at once, a bad NMT_CPU_MATMUL or
    NMT_CPU_INT8 is one error line before any work, and then Ctrl-C raises KeyboardInterrupt for the work's clean
    stops."""
    commands_module = callback.__module__.replace("nmt_cli.cli.", "nmt_cli.commands.")  # cli/X.py runs commands/X.py

    @functools.wraps(callback)
    def started(*args: Any, **kwargs: Any) -> Any:
        importlib.import_module(commands_module)
        from nmt_cli.model.linear import route_from_environment
        from nmt_cli.model.quantize import engine_from_environment

        route_from_environment()
        engine_from_environment()
        raise_on_ctrl_c()
        return callback(*args, **kwargs)

    return started


def start_commands_in(command: click.Command) -> None:
    """Every command under `command` (the subcommands of `plot` too) starts as `start_command` says."""
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            start_commands_in(subcommand)
    elif command.callback is not None:
        command.callback = start_command(command.callback)
        configurable(command)


for command in (preprocess, train, average_checkpoints, generate, score, score_pairs, export, plot, serve):
    start_commands_in(command)
    cli.add_command(command)


def main() -> None:
    # oneDNN caches a kernel per matmul shape, about 0.7 MB each, and its entries fragment the heap. Training's
    # linears pad row counts to a few dozen shapes (model/linear.py), but bf16 attention's batched products
    # take every batch's own shape. A smaller cache lowers bf16 training's peak memory; 32 entries keep the
    # speed of a larger cache in training and generation, where fewer cost speed (peak RSS and speed:
    # benchmarks/bench_train.py, bench_generate.py; figures in benchmarks/record/cpu.md).
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "32")
    quit_on_ctrl_c()  # until a command's work begins (start_command); already so from nmt_cli/__main__.py's start
    tune_allocator()
    guard_stdout()  # before any file is opened: a closed stdout's descriptor must not become one of them
    try:
        try:
            cli(prog_name="nmt")
        finally:
            finish_stdout()  # a failure here replaces the command's exit 0
    except KeyboardInterrupt:  # the final flush
        stop_interrupted()
    except StdoutError as e:  # outside a command (--help, --version) or at the final flush
        print_error(str(e))
        sys.exit(1)
    except BrokenPipeError:  # the final flush, the reader gone: quiet, as inside a command
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
