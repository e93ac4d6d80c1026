"""The `nmt` command: five subcommands, each parsing options into a config and calling one core function.

The only module that imports click. Errors the user can fix (NmtError) become one red line and exit 1;
click's usage errors exit 2; `--debug` shows tracebacks.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import click

from nmt_cli import __version__
from nmt_cli.allocator import tune_allocator
from nmt_cli.config import ARCHITECTURES, PreprocessConfig, SearchConfig, TrainConfig, parse_betas
from nmt_cli.errors import CheckpointError, ConfigError, NmtError
from nmt_cli.log import print_error, setup_logging

logger = logging.getLogger("nmt_cli.cli")

EXISTING_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
EXISTING_DIR = click.Path(exists=True, file_okay=False, path_type=Path)
CONTEXT = {"show_default": True, "help_option_names": ["-h", "--help"], "max_content_width": 110}


class NmtGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NmtError as e:
            if ctx.params.get("debug"):
                raise
            print_error(str(e))
            ctx.exit(1)


@click.group(cls=NmtGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="nmt")
@click.option("-v", "--verbose", count=True, help="More log output (-v: debug).")
@click.option("-q", "--quiet", is_flag=True, help="Warnings and errors only.")
@click.option("--no-progress", is_flag=True, help="No progress bars (they are off anyway when stderr is not a terminal).")
@click.option("--debug", is_flag=True, help="Show tracebacks for user errors too.")
def cli(verbose: int, quiet: bool, no_progress: bool, debug: bool) -> None:
    """Neural machine translation with the Transformer of "Attention Is All You Need".

    Pipeline: preprocess -> train -> average-checkpoints -> generate -> score.
    """
    setup_logging(-1 if quiet else verbose, progress=not no_progress)


# ---- preprocess ------------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.option("--source-lang", "-s", required=True, help="Source language suffix, e.g. en.")
@click.option("--target-lang", "-t", required=True, help="Target language suffix, e.g. de.")
@click.option("--trainpref", required=True, help="Training text prefix: PREFIX.{src,tgt}.")
@click.option("--validpref", help="Validation text prefix.")
@click.option("--testpref", help="Test prefixes, comma-separated (splits test, test1, ...).")
@click.option("--destdir", required=True, type=click.Path(path_type=Path), help="Output data directory (must not exist).")
@click.option("--vocab-size", default=8000, type=click.IntRange(min=8), help="Joint sentencepiece vocabulary size.")
@click.option("--model-type", default="bpe", type=click.Choice(["bpe", "unigram"]))
@click.option("--character-coverage", default=1.0, type=click.FloatRange(0.9, 1.0))
@click.option("--spm-model", type=EXISTING_FILE, help="Use this sentencepiece model instead of training one.")
@click.option("--spm-train-sentences", default=10_000_000, type=click.IntRange(min=1),
              help="At most this many lines sampled to train sentencepiece.")
@click.option("--max-len", default=250, type=click.IntRange(min=1), help="Drop training pairs longer than this (pieces).")
@click.option("--max-len-ratio", default=1.5, type=click.FloatRange(min=1.0), help="Drop training pairs with a longer length ratio.")
@click.option("--workers", default=1, type=click.IntRange(min=1), help="Encoding threads.")
@click.option("--target-format", default="text", type=click.Choice(["text", "ptb-tree"]),
              help="ptb-tree: the target files hold one bracketed Penn Treebank tree per line (parsing).")
@click.option("--tree-leaves", default="pos", type=click.Choice(["pos", "slot"]),
              help="ptb-tree: the target's leaves are the POS tags, or the placeholder XX (punctuation tags kept).")
def preprocess(**opts: Any) -> None:
    """Train a joint sentencepiece model and binarize train/valid/test."""
    from nmt_cli.data.preprocess import preprocess as run

    opts["destdir"] = str(opts["destdir"])
    opts["spm_model"] = str(opts["spm_model"]) if opts["spm_model"] else None
    meta = run(PreprocessConfig(**opts))
    click.echo(json.dumps({k: meta[k] for k in ("source_lang", "target_lang", "vocab_size", "splits")}))


# ---- train -----------------------------------------------------------------------------------------
MODEL_FLAGS = ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "dropout", "attention_dropout",
               "activation_dropout", "normalize_before", "learned_pos", "share_embeddings", "share_output_embed",
               "max_positions")
EVAL_FLAGS = {"eval_bleu_beam": "beam", "eval_bleu_lenpen": "lenpen", "eval_bleu_max_len_a": "max_len_a",
              "eval_bleu_max_len_b": "max_len_b"}


@cli.command(context_settings=CONTEXT)
@click.argument("data_dir", type=EXISTING_DIR)
@click.option("--save-dir", required=True, type=click.Path(path_type=Path), help="Checkpoint directory; resumes from checkpoint_last.pt there.")
@click.option("--arch", default="transformer_base", type=click.Choice(list(ARCHITECTURES)))
@click.option("--encoder-layers", type=click.IntRange(min=1), help="Overrides the preset.")
@click.option("--decoder-layers", type=click.IntRange(min=1), help="Overrides the preset.")
@click.option("--d-model", type=click.IntRange(min=1), help="Overrides the preset.")
@click.option("--d-ff", type=click.IntRange(min=1), help="Overrides the preset.")
@click.option("--heads", type=click.IntRange(min=1), help="Overrides the preset.")
@click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), help="Overrides the preset.")
@click.option("--attention-dropout", type=click.FloatRange(0, 1, max_open=True), help="Overrides the preset (0).")
@click.option("--activation-dropout", type=click.FloatRange(0, 1, max_open=True), help="Overrides the preset (0).")
@click.option("--normalize-before/--no-normalize-before", default=None, help="Pre-norm (default: post-norm, the paper's).")
@click.option("--learned-pos/--no-learned-pos", default=None, help="Learned positions (Table 3 row E).")
@click.option("--share-embeddings/--no-share-embeddings", default=None, help="Tie source and target embeddings (default on).")
@click.option("--share-output-embed/--no-share-output-embed", default=None, help="Tie target embedding and softmax (default on).")
@click.option("--max-positions", type=click.IntRange(min=2), help="Longest sequence the model accepts.")
@click.option("--max-tokens", default=4096, type=click.IntRange(min=1), help="Padded source (and target) tokens per batch, EOS included.")
@click.option("--update-freq", default=1, type=click.IntRange(min=1), help="Batches accumulated per update.")
@click.option("--max-update", default=0, type=click.IntRange(min=0), help="Stop after this many updates.")
@click.option("--max-epoch", default=0, type=click.IntRange(min=0), help="Stop after this many epochs.")
@click.option("--max-time-minutes", default=0.0, type=click.FloatRange(min=0), help="Stop after this much training wall clock.")
@click.option("--lr-scheduler", default="noam", type=click.Choice(["noam", "inverse_sqrt"]))
@click.option("--warmup-updates", default=4000, type=click.IntRange(min=1))
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), help="Peak lr of inverse_sqrt [default: 5e-4].")
@click.option("--lr-scale", default=1.0, type=click.FloatRange(min=0, min_open=True), help="Multiplies noam's lr.")
@click.option("--adam-betas", default="0.9,0.98", help="Adam beta1,beta2.")
@click.option("--adam-eps", default=1e-9, type=click.FloatRange(min=0))
@click.option("--clip-norm", default=0.0, type=click.FloatRange(min=0), help="Clip the gradient norm (0: off).")
@click.option("--weight-decay", default=0.0, type=click.FloatRange(min=0), help="Decoupled weight decay.")
@click.option("--label-smoothing", default=0.1, type=click.FloatRange(0, 1, max_open=True))
@click.option("--seed", default=1, type=int)
@click.option("--save-interval-updates", default=0, type=click.IntRange(min=0), help="Numbered checkpoint every N updates.")
@click.option("--save-interval-minutes", default=0.0, type=click.FloatRange(min=0), help="Numbered checkpoint every M minutes.")
@click.option("--keep-last", default=0, type=click.IntRange(min=0), help="Keep the newest N numbered checkpoints (0: all).")
@click.option("--validate-interval-updates", default=0, type=click.IntRange(min=0), help="Also validate every N updates.")
@click.option("--patience", default=0, type=click.IntRange(min=0), help="Stop after N validations without improvement.")
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda"]))
@click.option("--threads", default=0, type=click.IntRange(min=0), help="CPU threads (0: torch's default).")
@click.option("--log-interval", default=100, type=click.IntRange(min=1))
@click.option("--log-file", type=click.Path(dir_okay=False), help="Append every logged metric as JSON lines.")
@click.option("--bf16", is_flag=True, help="bfloat16 autocast (CPUs with AVX512-BF16 or AMX, Ampere+ GPUs).")
@click.option("--fp16", is_flag=True, help="float16 autocast with dynamic loss scaling (CUDA).")
@click.option("--max-nonfinite", default=10, type=click.IntRange(min=1), help="Stop after this many non-finite losses in a row.")
@click.option("--eval-bleu", is_flag=True, help="Also translate the valid split and log sacreBLEU.")
@click.option("--eval-bleu-beam", default=4, type=click.IntRange(min=1))
@click.option("--eval-bleu-lenpen", default=0.6, type=float)
@click.option("--eval-bleu-max-len-a", default=1.0, type=float)
@click.option("--eval-bleu-max-len-b", default=50, type=int)
@click.option("--eval-bleu-max-tokens", default=8000, type=click.IntRange(min=1), help="Token budget of BLEU batches.")
@click.option("--best-checkpoint-metric", default="loss", type=click.Choice(["loss", "bleu"]))
@click.option("--reset-optimizer", is_flag=True)
@click.option("--reset-lr-scheduler", is_flag=True)
@click.option("--reset-dataloader", is_flag=True)
def train(data_dir: Path, save_dir: Path, adam_betas: str, **opts: Any) -> None:
    """Train a Transformer on a data directory made by `nmt preprocess`."""
    from nmt_cli.train.trainer import train as run

    model_overrides = {k: opts.pop(k) for k in MODEL_FLAGS}
    search_cfg = SearchConfig(**{field: opts.pop(flag) for flag, field in EVAL_FLAGS.items()})
    cfg = TrainConfig(data_dir=str(data_dir), save_dir=str(save_dir), adam_betas=parse_betas(adam_betas), **opts)
    run(cfg, model_overrides, search_cfg)


# ---- average-checkpoints ---------------------------------------------------------------------------
@cli.command("average-checkpoints", context_settings=CONTEXT)
@click.option("--inputs", required=True, multiple=True, type=click.Path(exists=True, path_type=Path),
              help="Checkpoint files, or one directory (with --num-update-checkpoints). Repeat or list after it.")
@click.option("--num-update-checkpoints", type=click.IntRange(min=1), help="Average the last N checkpoint_<update>.pt of the directory.")
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.argument("more_inputs", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def average_checkpoints(inputs: tuple[Path, ...], num_update_checkpoints: int | None, output: Path,
                        more_inputs: tuple[Path, ...]) -> None:
    """Average the weights of several checkpoints (the paper averaged the last 5 or 20)."""
    from nmt_cli.checkpoint import average_checkpoints as average
    from nmt_cli.checkpoint import numbered_checkpoints, save_checkpoint

    paths = list(inputs) + list(more_inputs)
    if len(paths) == 1 and paths[0].is_dir():
        if not num_update_checkpoints:
            raise ConfigError(f"--inputs {paths[0]} is a directory; give --num-update-checkpoints N")
        found = numbered_checkpoints(paths[0])
        if len(found) < num_update_checkpoints:
            raise CheckpointError(f"{paths[0]} has {len(found)} numbered checkpoints, fewer than "
                                  f"--num-update-checkpoints {num_update_checkpoints}")
        paths = found[-num_update_checkpoints:]
    elif any(p.is_dir() for p in paths):
        raise ConfigError("--inputs takes either one directory or checkpoint files")
    state = average(paths)
    save_checkpoint(state, output)
    logger.info("averaged %d checkpoints into %s: %s", len(paths), output, ", ".join(p.name for p in paths))


# ---- generate --------------------------------------------------------------------------------------
SEARCH_FLAGS = ("beam", "lenpen", "lenpen_style", "max_len_a", "max_len_b", "min_len", "unkpen", "nbest",
                "sampling", "sampling_topk", "sampling_topp", "temperature", "seed")


@cli.command(context_settings=CONTEXT)
@click.argument("data_dir", required=False, type=EXISTING_DIR)
@click.option("--path", "checkpoint", required=True, type=click.Path(path_type=Path), help="Checkpoint to translate with.")
@click.option("--gen-subset", default="test", help="Split of DATA_DIR to translate.")
@click.option("--input", "input_path", help="Raw text file to translate, or - for stdin (instead of DATA_DIR).")
@click.option("--buffer-size", default=1000, type=click.IntRange(min=1), help="Lines read at a time with --input.")
@click.option("--output-format", type=click.Choice(["plain", "fairseq", "jsonl"]),
              help="[default: fairseq for DATA_DIR, plain for --input]; scores are in nats (natural log).")
@click.option("--results-path", type=click.Path(file_okay=False, path_type=Path), help="Write generate-SUBSET.txt here instead of stdout.")
@click.option("--max-tokens", default=8000, type=click.IntRange(min=1), help="Source tokens per batch.")
@click.option("--batch-size", default=0, type=click.IntRange(min=0), help="Also cap sentences per batch (0: no cap).")
@click.option("--beam", type=click.IntRange(min=1), help="Beam size; 1 is greedy [default: the checkpoint's, 4].")
@click.option("--lenpen", type=float, help="Length penalty alpha [default: the checkpoint's, 0.6].")
@click.option("--lenpen-style", type=click.Choice(["gnmt", "fairseq"]), help="gnmt: ((5+|Y|)/6)^a; fairseq: |Y|^a [default: gnmt].")
@click.option("--max-len-a", type=float, help="Max output length a*|x|+b [default: 1].")
@click.option("--max-len-b", type=int, help="[default: 50]")
@click.option("--min-len", type=click.IntRange(min=0), help="Min output length [default: 1].")
@click.option("--unkpen", type=float, help="Subtracted from the unk log-prob [default: 0].")
@click.option("--nbest", type=click.IntRange(min=1), help="Hypotheses per input [default: 1].")
@click.option("--sampling/--no-sampling", default=None, help="Sample instead of searching.")
@click.option("--sampling-topk", type=click.IntRange(min=0), help="Sample among the k best tokens (0: all).")
@click.option("--sampling-topp", type=click.FloatRange(0, 1, min_open=True), help="Nucleus sampling mass.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True))
@click.option("--seed", type=int, help="Sampling seed.")
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda"]))
@click.option("--threads", default=0, type=click.IntRange(min=0), help="CPU threads (0: torch's default).")
@click.option("--bf16", is_flag=True, help="bfloat16 autocast.")
@click.option("--fp16", is_flag=True, help="float16 autocast (CUDA).")
@click.option("--num-shards", default=1, type=click.IntRange(min=1), help="Split the input into contiguous shards.")
@click.option("--shard-id", default=0, type=click.IntRange(min=0), help="Which shard to translate.")
def generate(data_dir: Path | None, checkpoint: Path, input_path: str | None, results_path: Path | None,
             **opts: Any) -> None:
    """Translate a binarized split (DATA_DIR) or raw text (--input) with beam search."""
    from nmt_cli.search.run import GenerateRequest, run_generate

    overrides = {k: opts.pop(k) for k in SEARCH_FLAGS}
    request = GenerateRequest(data_dir=data_dir, checkpoint=checkpoint, input_path=input_path,
                              results_path=results_path, search_overrides=overrides, **opts)
    run_generate(request)


# ---- score -----------------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.option("--sys", "sys_path", required=True, type=EXISTING_FILE, help="Hypotheses: plain text or `nmt generate` fairseq output.")
@click.option("--ref", "ref_path", required=True, type=EXISTING_FILE, help="Reference text, one line per hypothesis.")
@click.option("--metric", "metrics", multiple=True,
              type=click.Choice(["sacrebleu", "chrf", "tok-bleu", "tok-bleu-compound", "bracket-f1"]),
              help="Repeatable [default: sacrebleu and chrf]. bracket-f1: EVALB (COLLINS.prm) on trees, alone.")
@click.option("--lang", default="en", help="Language of the Moses tokenizer for tok-bleu metrics.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per metric.")
@click.option("--verbose", is_flag=True, help="bracket-f1: also EVALB's line per sentence.")
def score(sys_path: Path, ref_path: Path, metrics: tuple[str, ...], lang: str, as_json: bool, verbose: bool) -> None:
    """Score translations: sacreBLEU (with its signature) and chrF; tokenized BLEU on request; trees: bracket-f1."""
    from nmt_cli.metrics import score_files

    if "bracket-f1" in metrics:  # constituency trees (nmt_cli/parsing/evalb.py)
        from nmt_cli.parsing.evalb import COLLINS, format_report, score_tree_files

        if len(set(metrics)) > 1:
            raise ConfigError("--metric bracket-f1 scores trees; give it alone")
        result = score_tree_files(sys_path, ref_path)
        click.echo(json.dumps({"metric": "bracket-f1", **result.all.summary()}) if as_json
                   else format_report(result, COLLINS, verbose))
        return

    for s in score_files(sys_path, ref_path, metrics or ("sacrebleu", "chrf"), lang):
        if as_json:
            click.echo(json.dumps({"metric": s.metric, "score": round(s.score, 2), "signature": s.signature}))
        else:
            click.echo(f"{s.text}  [{s.signature}]" if s.metric in ("sacrebleu", "chrf") else s.text)


def main() -> None:
    # oneDNN caches a kernel per matmul shape. Training pads row counts to a few dozen shapes
    # (model/linear.py), which 512 entries hold after warm-up; beam search's shapes are fewer still.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    tune_allocator()
    cli(prog_name="nmt")
