"""Training and translation on CUDA (`make test-gpu`); every test here is skipped where CUDA is absent.

Tolerances: fp32 on CUDA (TF32 matmuls, other kernels, another dropout generator: dropout is off here)
follows the CPU's loss curve within 2e-2 nats per update over 30 updates; bf16 and fp16 are only
asked to lower the loss.
"""

import json
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from conftest import tiny_train_config

from nmt_cli.checkpoint import load_checkpoint
from nmt_cli.commands.train import prepare, train
from nmt_cli.config import ARCHITECTURES, SearchConfig
from nmt_cli.data.dataset import ParallelDataset
from nmt_cli.runtime import choose_attention_backends
from nmt_cli.search.translate import SearchRequest, Translator, load_translator, translate
from nmt_cli.train.epoch_plan import plan_epoch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

TINY = ARCHITECTURES["transformer_tiny"]
FP32_LOSS_TOLERANCE = 2e-2


def losses(log_file):
    return [r["loss"] for r in map(json.loads, open(log_file)) if r["event"] == "train"]


def run(data_bin, save_dir, device, **kw):
    cfg = tiny_train_config(
        data_bin,
        save_dir,
        device=device,
        max_update=30,
        log_interval=1,
        log_file=str(save_dir.parent / f"{save_dir.name}.jsonl"),
        **kw,
    )
    train(cfg, replace(TINY, dropout=0.0), SearchConfig())
    return losses(cfg.log_file)


def test_fp32_on_cuda_follows_the_cpu_losses(toy_data_bin, tmp_path):
    cpu = run(toy_data_bin, tmp_path / "cpu", "cpu")
    cuda = run(toy_data_bin, tmp_path / "cuda", "cuda", precision="fp32")
    assert len(cpu) == len(cuda) == 30
    assert max(abs(a - b) for a, b in zip(cpu, cuda)) < FP32_LOSS_TOLERANCE, (cpu, cuda)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precisions_lower_the_loss(toy_data_bin, tmp_path, precision):
    curve = run(toy_data_bin, tmp_path / precision, "cuda", precision=precision)
    assert curve[-1] < curve[0] - 0.5, curve
    assert load_checkpoint(tmp_path / precision / "checkpoint_last.pt")["train_config"]["precision"] == precision


def test_training_update_makes_one_host_synchronisation(toy_data_bin, tmp_path):
    trainer = prepare(
        tiny_train_config(toy_data_bin, tmp_path, device="cuda", max_update=3, update_freq=2), TINY, SearchConfig()
    )
    assert trainer.optimizer.defaults["fused"]
    plan = plan_epoch(
        trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
    )
    assert syncs_of_the_second_update(trainer, plan) == 1


def syncs_of_the_second_update(trainer, plan) -> int:
    """The host synchronisations of the plan's second update of 2 batches, after a first one that warms up
    allocations, cuBLAS handles and the loader's plan."""
    trainer.train_step(plan.update_batches(0, 2), plan)
    trainer.state.consume_batches(2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as record:
            trainer.train_step(plan.update_batches(2, 2), plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message) for w in record if "synchroniz" in str(w.message)]
    assert syncs, "no synchronisation seen: the sync debug mode did not report"
    return len(syncs)


def test_killed_and_resumed_on_cuda_ends_bit_identical(toy_data_bin, tmp_path):
    args = [
        "--arch",
        "transformer_tiny",
        "--max-tokens",
        "256",
        "--warmup-updates",
        "4",
        "--device",
        "cuda",
        "--log-interval",
        "1",
        "--dropout",
        "0.3",
        "--max-update",
        "40",
    ]
    base = [sys.executable, "-m", "nmt_cli", "train", str(toy_data_bin)]
    whole = subprocess.run([*base, "--save-dir", str(tmp_path / "whole"), *args], capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-3000:]
    cmd = [*base, "--save-dir", str(tmp_path / "parts"), *args, "--save-interval-updates", "10"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        if "saved checkpoint_last.pt at update 10" in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    resumed = subprocess.run(cmd, capture_output=True, text=True)
    assert resumed.returncode == 0 and "resuming from" in resumed.stderr, resumed.stderr[-3000:]
    a = load_checkpoint(tmp_path / "whole" / "checkpoint_last.pt")["model"]
    b = load_checkpoint(tmp_path / "parts" / "checkpoint_last.pt")["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_beam_search_on_cuda_returns_the_cpus_hypotheses(tiny_checkpoint, toy_data_bin):
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(30)]
    cpu, _ = load_translator(tiny_checkpoint, torch.device("cpu"), None)
    cuda, _ = load_translator(tiny_checkpoint, torch.device("cuda"), None)
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 for the comparison
    try:
        on_cpu = translate(cpu, SearchRequest(sources, SearchConfig(beam=4), 1000))
        on_cuda = translate(cuda, SearchRequest(sources, SearchConfig(beam=4), 1000))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True
    assert [h[0].tokens for h in on_cuda] == [h[0].tokens for h in on_cpu]
    for a, b in zip(on_cpu, on_cuda):
        assert abs(a[0].score - b[0].score) < 1e-3


def cuda_syncs(translator, sources, n):
    """Host synchronisations of translating `sources` in exactly n + 1 steps (one batch), after a warm-up."""
    cfg = SearchConfig(beam=4, max_len_a=0, max_len_b=n, min_len=n)
    translate(translator, SearchRequest(sources, cfg, 10000))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as record:
            translate(translator, SearchRequest(sources, cfg, 10000))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return len([w for w in record if "synchroniz" in str(w.message)])


def test_beam_search_makes_one_host_synchronisation_per_step(tiny_checkpoint, toy_data_bin):
    """One a step: int(done.sum()), how many sentences are done. A batch adds six: its padded sources and
    maximum lengths copied to the device, and collect()'s four copies of the finished hypotheses back.
    (On main 7d749f7: 71 for 21 steps; two a step were Python numbers written through tensor indices in
    finish(). tests/search/test_beam_syncs.py counts the same on the CPU.)"""
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(30)]
    choose_attention_backends(torch.device("cuda"), False)  # as `nmt generate` starts
    translator, _ = load_translator(tiny_checkpoint, torch.device("cuda"), torch.bfloat16)
    short, long = cuda_syncs(translator, sources, 10), cuda_syncs(translator, sources, 20)
    assert long - short == 10, (short, long)
    assert long <= 21 + 6, long


def test_training_and_beam_search_run_no_cudnn_attention(toy_data_bin, tmp_path):
    """The backends train sets as it starts (runtime.choose_attention_backends) keep cuDNN's per-shape attention
    plans out of a training update and of beam search (heads of 64, as transformer_base's)."""
    model_cfg = replace(TINY, d_model=128, heads=2, d_ff=256, dropout=0.0)
    trainer = prepare(
        tiny_train_config(toy_data_bin, tmp_path, device="cuda", precision="bf16", max_update=4),
        model_cfg,
        SearchConfig(),
    )
    batches = plan_epoch(
        trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
    ).batches
    trainer.train_step(batches[:1])
    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(8)]
    translator = Translator(trainer.model, trainer.vocab, torch.device("cuda"), torch.bfloat16)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        trainer.train_step(batches[1:2])
        trainer.model.eval()
        translate(translator, SearchRequest(sources, SearchConfig(beam=4, max_len_a=0, max_len_b=3, min_len=3), 1000))
        torch.cuda.synchronize()
    names = {e.name for e in prof.events()}
    assert any("scaled_dot_product_attention" in n for n in names)  # the profile saw attention run
    assert not [n for n in names if "cudnn" in n.lower()], sorted(n for n in names if "cudnn" in n.lower())


def test_generate_in_bf16_on_cuda(tiny_checkpoint, toy_data_bin, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt_cli",
            "generate",
            str(toy_data_bin),
            "--path",
            str(tiny_checkpoint),
            "--device",
            "cuda",
            "--precision",
            "bf16",
            "--results-path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    hyps = [line for line in (tmp_path / "generate-test.txt").read_text().splitlines() if line.startswith("H-")]
    assert len(hyps) == 30


def test_fixed_slots_and_cuda_graphs_return_the_beam_searchs_hypotheses(trained_copy_checkpoint, toy_data_bin):
    """search/slots.py eagerly and replaying captured steps (search/graphs.py) against beam.py's search, in fp32;
    batches of several buckets, one of them twice (a captured step reused).

    The model is the trained copy model, whose beams are decisive, as in tests/search/test_slots.py: on an H200 the
    untrained tiny checkpoint (outputs of one repeated piece, to the maximum length) flipped near-ties between the
    two searches, whose attention reads caches of different lengths through different kernels."""
    from nmt_cli.search.slots import slot_search_for

    test = ParallelDataset(toy_data_bin, "test")
    sources = [test.src[i] for i in range(len(test))]  # all 30
    choose_attention_backends(torch.device("cuda"), False)
    cuda, _ = load_translator(trained_copy_checkpoint, torch.device("cuda"), None)
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 for the comparison
    try:
        want = translate(cuda, SearchRequest(sources, SearchConfig(beam=4, nbest=2), 60))
        assert len({len(hyps[0].tokens) for hyps in want}) > 3  # sentences finish at different steps
        for graphs in (False, True):
            slots = slot_search_for(True, graphs, cuda.device)
            assert slots.cuda_graphs == graphs
            fixed = Translator(cuda.model, cuda.vocab, cuda.device, slots=slots)
            captures = []
            for _ in range(2):
                got = translate(fixed, SearchRequest(sources, SearchConfig(beam=4, nbest=2), 60))
                differ = [
                    i for i, (a, b) in enumerate(zip(want, got)) if [h.tokens for h in a] != [h.tokens for h in b]
                ]
                assert not differ, f"graphs={graphs}: sentences {differ} differ"
                for a, b in zip(want, got):
                    assert max(abs(x.score - y.score) for x, y in zip(a, b)) < 1e-4
                captures.append(slots.graphs.n_captures if graphs else 0)
            if graphs:  # the second pass replays the first one's captures (its few buckets all kept)
                assert captures[0] == captures[1] > 0, captures
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True


def test_cuda_graphs_make_one_host_synchronisation_per_step(tiny_checkpoint, toy_data_bin):
    """As beam.py's search: one a step (how many sentences are still searching), a few a batch."""
    from nmt_cli.search.slots import slot_search_for

    sources = [ParallelDataset(toy_data_bin, "test").src[i] for i in range(30)]
    choose_attention_backends(torch.device("cuda"), False)
    translator, _ = load_translator(tiny_checkpoint, torch.device("cuda"), torch.bfloat16)
    translator = replace(translator, slots=slot_search_for(True, True, translator.device))
    short, long = cuda_syncs(translator, sources, 10), cuda_syncs(translator, sources, 20)
    assert long - short == 10, (short, long)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_training_with_cuda_graphs_follows_the_eager_step(toy_data_bin, tmp_path, dropout):
    """fp32 updates with --cuda-graphs: the eager step's gradients and losses. The graph scores every padded position
    (the loss ignores PAD) where the eager step selects the real ones, so sums differ in order only. With dropout,
    a replay draws the masks the eager step draws (Philox offsets advance alike; the warm-up puts the streams back).

    Gradients are compared at the first update, where both hold the same weights. Weights after several updates are
    not compared: Adam turns a gradient of rounding size into a step of learning-rate size whose sign is the
    rounding's (on an H200, 5 of 768 embedding weights differed by 0.003 after 8 updates at lr 0.035)."""

    def config(name, **kw):
        return tiny_train_config(
            toy_data_bin,
            tmp_path / name,
            device="cuda",
            precision="fp32",
            bucket_shapes=True,
            max_update=8,
            update_freq=2,
            log_interval=1,
            log_file=str(tmp_path / f"{name}.jsonl"),
            **kw,
        )

    model_cfg = replace(TINY, dropout=dropout)
    gradients = []
    for name, graphs in (("eager-grads", False), ("graph-grads", True)):
        (tmp_path / name).mkdir()
        trainer = prepare(config(name, cuda_graphs=graphs), model_cfg, SearchConfig())
        plan = plan_epoch(
            trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
        )
        totals = trainer.accumulate(plan.update_batches(0, 2))
        gradients.append((totals.tolist(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()}))
    (eager_totals, eager_grads), (graph_totals, graph_grads) = gradients
    assert graph_totals == pytest.approx(eager_totals, rel=1e-5)
    assert eager_grads.keys() == graph_grads.keys()
    for name, want in eager_grads.items():
        scale = want.abs().max().item()
        torch.testing.assert_close(graph_grads[name], want, rtol=1e-3, atol=1e-4 * scale, msg=lambda m: f"{name}: {m}")

    def fit(name, **kw):
        cfg = config(name, **kw)
        return train(cfg, model_cfg, SearchConfig()).trainer, losses(cfg.log_file)

    (_, eager_losses), (graphed, graph_losses) = fit("eager"), fit("graphs", cuda_graphs=True)
    assert graphed.graphs.n_replays == 16 and 0 < graphed.graphs.n_captures == len(graphed.graphs.graphs) < 16
    assert None not in graphed.graphs.graphs.values()  # every shape captured, none fell back to eager
    assert max(abs(a - b) for a, b in zip(eager_losses, graph_losses)) < 2e-3, (eager_losses, graph_losses)


def test_training_update_with_cuda_graphs_makes_one_host_synchronisation(toy_data_bin, tmp_path):
    cfg = tiny_train_config(
        toy_data_bin, tmp_path, device="cuda", max_update=3, update_freq=2, bucket_shapes=True, cuda_graphs=True
    )
    trainer = prepare(cfg, TINY, SearchConfig())
    plan = plan_epoch(
        trainer.train_data, trainer.cfg, max_positions=trainer.model_cfg.max_positions, info=trainer.info, epoch=1
    )
    trainer.train_step(plan.update_batches(2, 2))  # captures the shapes of the update measured below
    trainer.train_step(plan.update_batches(0, 2))  # and those of the warm-up update
    n_captures = trainer.graphs.n_captures
    assert syncs_of_the_second_update(trainer, plan) == 1
    assert trainer.graphs.n_captures == n_captures and trainer.graphs.n_replays == 8  # 4 updates of 2 batches
