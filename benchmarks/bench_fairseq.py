"""fairseq beside nmt on one device (issue 50): training speed on the same data, and quality at equal updates.

    python benchmarks/bench_fairseq.py speed [--results FILE]                 # CUDA: transformer_base and _big
    python benchmarks/bench_fairseq.py quality --raw-dir DIR [--results FILE] # Multi30k, beam 4 on test_2016
    python benchmarks/bench_fairseq.py ... --device cpu                       # tiny sizes: checks the script

fairseq (fairseq-fixed 0.12.3.1) must be importable: gpu_check.sh installs benchmarks/fairseq_bundle.sh's
wheels and puts them on PYTHONPATH. Both toolkits read the same token ids: nmt's data directory (bench_gpu.py's
synthetic one for speed, `nmt preprocess` of Multi30k for quality) is written out in fairseq's binary format
with the same ids (fairseq's special symbols sit where nmt's do not occur), so the pieces, sentences and
vocabulary size are the same for both.

speed: per architecture the same model (nmt's transformer_base / _big = fairseq's transformer_wmt_en_de /
transformer_wmt_en_de_big with attention dropout 0, all embeddings shared, post-norm), the same --max-tokens,
WARM untimed updates then MEAS timed ones. fairseq runs with --fp16 (faster than its --bf16 for base and big
on an H200); with --fairseq-precisions fp16,bf16 it runs with each on the first architecture and keeps the
faster for the rest (the row says which); nmt runs bf16 (autocast). fairseq's
target tok/s = the target tokens (wpb) of updates WARM+1..WARM+MEAS over the wall time between the log lines
of update WARM and WARM+MEAS (--log-interval 1, stamped here as the lines arrive); nmt's from bench_gpu.py's
Trainer loop (one host sync per update, as fairseq's logging makes). fairseq's batches hold a multiple of 8
sentences (its default --required-batch-size-multiple), so its target tokens per update come out slightly
fewer at the same --max-tokens: each row prints its own. Peak GPU memory: torch's allocator peak in each
process (fairseq's and nmt's over the whole run, warm-up included). The runs alternate (fairseq, nmt, then
fairseq's other precision if asked, on the first architecture; nmt then fairseq on the next). Then nmt's
first architecture again with `--bucket-shapes`, with `--bucket-shapes --cuda-graphs` (CUDA; its warm-up
captures every timed shape), with the Triton loss off (the fused loss's kernel is chosen in
nmt_cli/train/loss.py by `fused_kernel`, which this script replaces for that row) and plain again (CUDA: how
far two runs of one setting move); then the other architectures with `--bucket-shapes --cuda-graphs` (CUDA).

quality: the same Multi30k pieces, transformer_small's shape for both (3+3 layers, 256 wide), the same
settings (inverse_sqrt to --lr over --warmup updates, Adam 0.9/0.98 eps 1e-9, label smoothing 0.1, dropout
0.2, --max-tokens) for --quality-updates updates without validation, then beam 4 on test_2016_flickr
(nmt: its defaults, lenpen 0.6 GNMT style; fairseq: its own, length-normalised) and sacreBLEU of each.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

# fairseq's arguments for each nmt architecture (nmt's post-norm, attention and activation dropout 0, tied)
FAIRSEQ_ARCH = {
    "transformer_base": ["--arch", "transformer_wmt_en_de"],
    "transformer_big": ["--arch", "transformer_wmt_en_de_big", "--attention-dropout", "0.0"],
    "transformer_small": ["--arch", "transformer", "--encoder-layers", "3", "--decoder-layers", "3"]
    + ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024"]
    + ["--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
    "transformer_tiny": ["--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2"]
    + ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64"]
    + ["--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
    + ["--max-source-positions", "256", "--max-target-positions", "256"],
}
COMMON = ["--share-all-embeddings", "--attention-dropout", "0.0", "--activation-dropout", "0.0"]
OPTIM = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--lr-scheduler", "inverse_sqrt"]
OPTIM += ["--warmup-init-lr", "0", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1"]
CPU = dict(archs="transformer_tiny", max_tokens=512, warm=2, meas=3, sentences=300, vocab=1000)
GPU = dict(archs="transformer_base,transformer_big", max_tokens=25000, warm=5, meas=20, sentences=100_000, vocab=37000)
# nmt's special ids pad 0, unk 1, bos 2, eos 3; fairseq's bos 0, pad 1, eos 2, unk 3: only unk occurs in data
NMT_UNK, FAIRSEQ_UNK, FAIRSEQ_EOS = 1, 3, 2


def write_fairseq_split(nmt_dir: Path, split: str, langs: tuple[str, str], fs_dir: Path, fs_langs: tuple[str, str]):
    """nmt's {split}.{lang}.bin.npy / .idx.npy as fairseq's mmap dataset {split}.{s}-{t}.{lang}.bin / .idx,
    EOS appended to each sentence as fairseq-preprocess does."""
    for lang, fs_lang in zip(langs, fs_langs):
        tokens = np.load(nmt_dir / f"{split}.{lang}.bin.npy").astype(np.int32)
        offsets = np.load(nmt_dir / f"{split}.{lang}.idx.npy").astype(np.int64)
        tokens[tokens == NMT_UNK] = FAIRSEQ_UNK
        sizes = np.diff(offsets) + 1
        out = np.full(int(sizes.sum()), FAIRSEQ_EOS, dtype=np.uint16 if tokens.max(initial=0) < 65500 else np.int32)
        starts = offsets[:-1] + np.arange(len(sizes))  # each sentence moves right by the EOS before it
        positions = np.repeat(starts - offsets[:-1], np.diff(offsets)) + np.arange(len(tokens))
        out[positions] = tokens
        prefix = fs_dir / f"{split}.{fs_langs[0]}-{fs_langs[1]}.{fs_lang}"
        out.tofile(f"{prefix}.bin")
        code = 8 if out.dtype == np.uint16 else 4  # fairseq's dtype codes: 8 uint16, 4 int32
        pointers = np.concatenate([[0], np.cumsum(sizes)[:-1]]) * out.itemsize
        with open(f"{prefix}.idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([code]) + len(sizes).to_bytes(8, "little"))
            f.write(sizes.astype(np.int32).tobytes() + pointers.astype(np.int64).tobytes())


def write_fairseq_dict(fs_dir: Path, symbols: list[str], fs_langs: tuple[str, str]) -> None:
    """dict.{lang}.txt for both languages: fairseq puts its four specials first, so symbol i of `symbols`
    (nmt's id i + 4) gets fairseq's id i + 4."""
    text = "".join(f"{s} 1\n" for s in symbols)
    for lang in fs_langs:
        (fs_dir / f"dict.{lang}.txt").write_text(text)


def fairseq_run(argv: list[str], log, warm: int, meas: int) -> dict:
    """fairseq-train ARGV in a child (this script's fairseq-train mode), its lines stamped as they arrive:
    target tok/s of updates warm+1..warm+meas, their target tokens per update and the peak GPU memory.
    Raises RuntimeError where the child fails or logs too few updates."""
    command = [sys.executable, "-u", __file__, "fairseq-train", *argv]
    log.write(f"+ {' '.join(command)}\n")
    stamps, wpb, peak = {}, {}, 0.0
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            now = time.perf_counter()
            log.write(line)
            if "| train_inner |" in line:
                d = json.loads(line[line.index("{") :])
                stamps[int(d["num_updates"])], wpb[int(d["num_updates"])] = now, float(d["wpb"])
            elif line.startswith("PEAK_GIB "):
                peak = float(line.split()[1])
    log.flush()
    if child.returncode != 0 or warm not in stamps or warm + meas not in stamps:
        raise RuntimeError(f"fairseq-train exit {child.returncode}, last updates logged {sorted(stamps)[-3:]}")
    tokens = sum(wpb[u] for u in range(warm + 1, warm + meas + 1))
    seconds = stamps[warm + meas] - stamps[warm]
    return dict(target_tok_s=round(tokens / seconds), tokens_per_update=round(tokens / meas), peak_gib=round(peak, 1))


def fairseq_train_main(argv: list[str]) -> None:
    """fairseq_cli.train with argv, then torch's peak GPU memory of the process as `PEAK_GIB x`."""
    import torch
    from fairseq_cli.train import cli_main

    # fairseq's trainer resets the allocator's peak after every update (to log that update's own, as gb_free),
    # which left the peak read here at the last update's tail: 1.2 GiB for transformer_base on the H200 on
    # 2026-11-27. With the reset a no-op the peak is the whole run's, as nmt's is.
    torch.cuda.reset_peak_memory_stats = lambda *args, **kwargs: None
    sys.argv = ["fairseq-train", *argv]
    cli_main()
    if torch.cuda.is_available():
        print(f"PEAK_GIB {torch.cuda.max_memory_allocated() / 2**30:.2f}", flush=True)


def precision_args(precision: str) -> list[str]:
    return {"fp32": ["--cpu"], "bf16": ["--bf16"], "fp16": ["--fp16"]}[precision]


def nmt_speed(
    arch: str, data_dir: Path, args, *, bucket_shapes: bool = False, triton: bool = True, cuda_graphs: bool = False
) -> dict:
    """bench_gpu.py's training figures for `arch` on data_dir (the real Trainer, WARM untimed updates)."""
    import bench_gpu

    import nmt_cli.train.loss as loss

    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
        ns = argparse.Namespace(
            max_tokens=args.max_tokens,
            precision="fp32" if args.device == "cpu" else "bf16",
            cudnn_attention=False,
            bucket_shapes=bucket_shapes,
            cuda_graphs=cuda_graphs,
            warmup=args.warm,
            updates=args.meas,
            busy_updates=0,
            results=out.name,
            device_name=args.device_name,
        )
        kernel = loss.fused_kernel
        if not triton:
            loss.fused_kernel = lambda z: None  # PyTorch's element-wise passes instead of the Triton kernel
        try:
            bench_gpu.bench_training(arch, data_dir, ns, args.torch_device, args.peak)
        finally:
            loss.fused_kernel = kernel
        figures = json.loads(out.read().splitlines()[-1])
    tokens = figures["target_tok_s"] * figures["ms_per_update"] / 1000
    return dict(target_tok_s=figures["target_tok_s"], tokens_per_update=round(tokens), peak_gib=figures["peak_gib"])


def record(args, **row) -> None:
    line = json.dumps({**row, "device": args.device_name})
    print(line, flush=True)
    if args.results:
        with open(args.results, "a") as f:
            f.write(line + "\n")


def speed(args) -> None:
    import bench_gpu
    import torch

    from nmt_cli.runtime import choose_attention_backends

    choose_attention_backends(args.torch_device, False)
    if args.device == "cpu":
        torch.set_num_threads(1)
    log = sys.stderr  # the children's output
    with tempfile.TemporaryDirectory(prefix="bench-fairseq-") as tmp:
        nmt_dir = bench_gpu.synthetic_data_dir(Path(tmp), args.sentences, args.vocab)
        fs_dir = Path(tmp) / "fairseq-bin"
        fs_dir.mkdir()
        write_fairseq_split(nmt_dir, "train", ("src", "tgt"), fs_dir, ("src", "tgt"))
        write_fairseq_dict(fs_dir, [f"p{i}" for i in range(4, args.vocab)], ("src", "tgt"))
        precisions = ["fp32"] if args.device == "cpu" else args.fairseq_precisions.split(",")
        nmt_precision = "fp32" if args.device == "cpu" else "bf16"
        for i, arch in enumerate(args.archs.split(",")):
            base = [str(fs_dir), "--task", "translation", "-s", "src", "-t", "tgt", *FAIRSEQ_ARCH[arch], *COMMON]
            base += [*OPTIM, "--lr", "5e-4", "--warmup-updates", "4000", "--max-tokens", str(args.max_tokens)]
            base += ["--max-update", str(args.warm + args.meas), "--log-format", "json", "--log-interval", "1"]
            base += ["--disable-validation", "--no-save", "--seed", "1"]

            def fairseq_row(precision: str) -> dict | None:
                """The figures of one fairseq run, or None (its failure recorded) where it failed."""
                try:
                    figures = fairseq_run([*base, *precision_args(precision)], log, args.warm, args.meas)
                except RuntimeError as failure:
                    record(args, what=f"speed {arch}", toolkit="fairseq", precision=precision, failed=str(failure))
                    return None
                row = dict(what=f"speed {arch}", toolkit="fairseq", precision=precision, **figures)
                record(args, **row)
                return row

            def nmt_row() -> None:
                figures = nmt_speed(arch, nmt_dir, args)
                record(args, what=f"speed {arch}", toolkit="nmt", variant="", precision=nmt_precision, **figures)

            if i == 0:  # fairseq's precisions around nmt's run; the fastest serves the rest
                rows = [fairseq_row(precisions[0])]
                nmt_row()
                rows += [fairseq_row(p) for p in precisions[1:]]
                done = [r for r in rows if r is not None]
                if not done:
                    raise SystemExit(f"fairseq failed with {' and '.join(precisions)} (see its output above)")
                precisions = [max(done, key=lambda r: r["target_tok_s"])["precision"]]
            else:
                nmt_row()
                fairseq_row(precisions[0])
        # nmt's options, after every side-by-side row (a step cut short keeps those): on the first architecture,
        # then --cuda-graphs on the others; the plain run again after the Triton loss's, so that the table shows
        # how far two runs of one setting move (both H200 runs had the Triton loss off 6-14% faster, one run each)
        first, *rest = args.archs.split(",")
        graphs = ("--bucket-shapes --cuda-graphs", {"bucket_shapes": True, "cuda_graphs": True})
        variants = [(first, "--bucket-shapes", {"bucket_shapes": True})]
        if args.device == "cuda":
            variants += [(first, *graphs), (first, "Triton loss off", {"triton": False}), (first, "again", {})]
            variants += [(arch, *graphs) for arch in rest]
        for arch, variant, how in variants:
            figures = nmt_speed(arch, nmt_dir, args, **how)
            record(args, what=f"speed {arch}", toolkit="nmt", variant=variant, precision=nmt_precision, **figures)


def run(command: list[str], stdout=None) -> None:
    """COMMAND from the checkout, its output (or its stderr where stdout is given) on this script's stderr."""
    print(f"+ {' '.join(command)}", file=sys.stderr, flush=True)
    subprocess.run(command, stdout=stdout or sys.stderr, stderr=sys.stderr, check=True, cwd=ROOT)


def head_lines(src: Path, dest: Path, n: int | None) -> None:
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    dest.write_text("".join(lines[:n] if n else lines), encoding="utf-8")


def quality(args) -> None:
    work = Path(args.work)
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", args.train_lines), ("test_2016_flickr", args.test_lines)):
        for lang in ("en", "de"):
            head_lines(Path(args.raw_dir) / f"{split}.{lang}", raw / f"{split}.{lang}", n)
    nmt = [sys.executable, "-m", "nmt_cli"]
    settings = ["--max-tokens", str(args.quality_max_tokens), "--warmup-updates", str(args.quality_warmup)]
    settings += ["--max-update", str(args.quality_updates), "--dropout", "0.2", "--seed", "1"]
    data, fs_dir = work / "nmt-bin", work / "fairseq-bin"
    precision = "fp32" if args.device == "cpu" else "bf16"
    run([*nmt, "preprocess", "-s", "en", "-t", "de", "--trainpref", str(raw / "train")]
        + ["--testpref", str(raw / "test_2016_flickr"), "--destdir", str(data), "--vocab-size", str(args.pieces)]
        + ["--max-len-ratio", "3"])  # fmt: skip
    t0 = time.perf_counter()
    run([*nmt, "train", str(data), "--save-dir", str(work / "nmt-ckpt"), "--arch", args.quality_arch, *settings]
        + ["--lr-scheduler", "inverse_sqrt", "--lr", "5e-4", "--label-smoothing", "0.1", "--log-interval", "100"]
        + ["--device", args.device, "--precision", precision])  # fmt: skip
    nmt_s = time.perf_counter() - t0
    with open(work / "nmt.hyp.de", "w") as hyp:
        run([*nmt, "generate", "--path", str(work / "nmt-ckpt" / "checkpoint_last.pt"), "--beam", "4"]
            + ["--input", str(raw / "test_2016_flickr.en"), "--device", args.device], stdout=hyp)  # fmt: skip
    refs = (raw / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    nmt_hyps = (work / "nmt.hyp.de").read_text(encoding="utf-8").splitlines()
    record_quality(args, "nmt", nmt_hyps, refs, nmt_s, precision)  # before fairseq's run: kept if that is cut short
    fs_dir.mkdir(exist_ok=True)
    for split in ("train", "test"):
        write_fairseq_split(data, split, ("en", "de"), fs_dir, ("en", "de"))
    pieces = [line.split("\t")[0] for line in (data / "vocab.txt").read_text(encoding="utf-8").splitlines()]
    write_fairseq_dict(fs_dir, pieces[4:], ("en", "de"))
    # nmt's precision where fairseq can train in it, else fairseq's own mixed precision (the row says which)
    for fs_precision in ["fp32"] if args.device == "cpu" else ["bf16", "fp16"]:
        t0 = time.perf_counter()
        try:
            run([sys.executable, __file__, "fairseq-train", str(fs_dir), "--task", "translation", "-s", "en"]
                + ["-t", "de", *FAIRSEQ_ARCH[args.quality_arch], *COMMON, *OPTIM, "--lr", "5e-4", *settings]
                + [*precision_args(fs_precision), "--disable-validation", "--save-dir", str(work / "fairseq-ckpt")]
                + ["--no-epoch-checkpoints", "--log-format", "json", "--log-interval", "100"])  # fmt: skip
            break
        except subprocess.CalledProcessError:
            if fs_precision == "fp16" or args.device == "cpu":
                raise
            print("bench_fairseq: fairseq --bf16 failed; training with --fp16", file=sys.stderr, flush=True)
    fairseq_s = time.perf_counter() - t0
    out = work / "fairseq.generate"
    with open(out, "w") as gen:
        run([sys.executable, "-m", "fairseq_cli.generate", str(fs_dir), "--task", "translation", "-s", "en"]
            + ["-t", "de", "--path", str(work / "fairseq-ckpt" / "checkpoint_last.pt"), "--gen-subset", "test"]
            + ["--beam", "4", "--batch-size", "128", "--required-batch-size-multiple", "1", "--max-len-a", "1"]
            + ["--max-len-b", "50", "--post-process", "sentencepiece", *precision_args(fs_precision)],
            stdout=gen)  # fmt: skip
    found = [re.match(r"D-(\d+)\t\S+\t(.*)$", line) for line in out.read_text(encoding="utf-8").splitlines()]
    fairseq_hyps = [m.group(2) for m in sorted((m for m in found if m), key=lambda m: int(m.group(1)))]
    record_quality(args, "fairseq", fairseq_hyps, refs, fairseq_s, fs_precision)


def record_quality(args, toolkit: str, hyps: list[str], refs: list[str], seconds: float, trained_in: str) -> None:
    import sacrebleu

    if len(hyps) != len(refs):
        raise SystemExit(f"{toolkit} translated {len(hyps)} of {len(refs)} test sentences")
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    record(
        args,
        what="quality multi30k",
        toolkit=toolkit,
        updates=args.quality_updates,
        precision=trained_in,
        bleu=round(bleu, 2),
        train_s=round(seconds, 1),
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("speed", "quality"))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: tiny sizes")
    parser.add_argument("--results", help="append each figure to this file as a JSON line")
    parser.add_argument("--archs", help=f"[default: {GPU['archs']}; cpu: {CPU['archs']}]")
    parser.add_argument("--max-tokens", type=int, help="per update, both toolkits [default: 25000]")
    parser.add_argument(
        "--fairseq-precisions",
        default="fp16",
        help="speed, CUDA: fairseq's mixed precisions tried on the first architecture, the fastest kept for the rest; "
        "--fp16 beat --bf16 for base and big on the H200 on 2026-11-27 [default: fp16; both: fp16,bf16]",
    )
    parser.add_argument("--warm", type=int, help="untimed updates [default: 5]")
    parser.add_argument("--meas", type=int, help="timed updates [default: 20]")
    parser.add_argument("--sentences", type=int, help="synthetic training pairs [default: 100000]")
    parser.add_argument("--vocab", type=int, help="synthetic pieces [default: 37000]")
    parser.add_argument("--raw-dir", help="quality: Multi30k's train and test_2016_flickr .en/.de")
    parser.add_argument("--work", help="quality: where its data, checkpoints and translations go")
    parser.add_argument("--quality-updates", type=int, help="[default: 1500; cpu: 4]")
    parser.add_argument("--quality-arch", help="[default: transformer_small; cpu: transformer_tiny]")
    parser.add_argument("--quality-max-tokens", type=int, help="[default: 4096; cpu: 512]")
    parser.add_argument("--quality-warmup", type=int, default=1000)
    parser.add_argument("--pieces", type=int, help="quality: sentencepiece vocabulary [default: 8000; cpu: 300]")
    parser.add_argument("--train-lines", type=int, help="quality: first N training pairs [default: all; cpu: 500]")
    parser.add_argument("--test-lines", type=int, help="quality: first N test pairs [default: all; cpu: 8]")
    args = parser.parse_args()
    cpu = args.device == "cpu"
    for key, value in (CPU if cpu else GPU).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key, gpu_value, cpu_value in (
        ("quality_updates", 1500, 4),
        ("quality_arch", "transformer_small", "transformer_tiny"),
        ("quality_max_tokens", 4096, 512),
        ("pieces", 8000, 300),
        ("train_lines", None, 500),
        ("test_lines", None, 8),
    ):
        if getattr(args, key) is None:
            setattr(args, key, cpu_value if cpu else gpu_value)
    if args.mode == "quality" and not (args.raw_dir and args.work):
        parser.error("quality needs --raw-dir and --work")
    return args


def main() -> None:
    if sys.argv[1:2] == ["fairseq-train"]:
        fairseq_train_main(sys.argv[2:])
        return
    args = parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_fairseq: no CUDA device; skipped")
        return
    args.torch_device = torch.device(args.device)
    args.device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    if args.device == "cuda":
        import bench_gpu

        args.peak = bench_gpu.peak_tflops(args.device_name, None)
    else:
        args.peak = 1.0
    speed(args) if args.mode == "speed" else quality(args)


if __name__ == "__main__":
    main()
