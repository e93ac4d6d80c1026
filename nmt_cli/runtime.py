"""Seeding and random-stream state, device and thread choice, precision, and the distributed process group."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt_cli.errors import ConfigError

logger = logging.getLogger(__name__)


# CPU dropout's random bits (model/layers.py): PCG64 gives four 16-bit numbers a call, a fraction of the time
# torch's CPU generator takes (`benchmarks/profile_step.py`). Seeded and saved with the other streams.
DROPOUT_STREAM = np.random.PCG64(0)


def random_int16(n: int) -> np.ndarray:
    """n independent uniform int16 values from the dropout stream."""
    return DROPOUT_STREAM.random_raw((n + 3) // 4).view(np.int16)[:n]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    DROPOUT_STREAM.state = np.random.PCG64(seed).state


def rng_state() -> dict[str, Any]:
    """This process's random streams: Python's, NumPy's, torch's CPU and CUDA generators, CPU dropout's."""
    name, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    rng = {
        "python": random.getstate(),
        "numpy": [name, key.tolist(), pos, has_gauss, gauss],  # type: ignore[union-attr]
        "torch": torch.get_rng_state(),
        "dropout": DROPOUT_STREAM.state,
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def set_rng_state(rng: dict[str, Any]) -> None:
    random.setstate(rng["python"])
    name, key, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"])
    if "dropout" in rng:  # absent from checkpoints written before dropout had its own stream
        DROPOUT_STREAM.state = rng["dropout"]
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def choose_device(name: str, local_rank: int = 0) -> torch.device:
    """Map --device auto|cpu|cuda to a torch.device (auto: CUDA when available)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda was given but no CUDA device is available; use --device cpu")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


# Where the CPU quota of this process's control group is read (tests point them at fake files)
PROC_CGROUP, CGROUP_ROOT = Path("/proc/self/cgroup"), Path("/sys/fs/cgroup")


def cgroup_cpus() -> float | None:
    """The CPUs this process's control group quota allows, the lowest of its group's and those above (v2's cpu.max,
    v1's cpu.cfs_quota_us / cpu.cfs_period_us); None where none is set or readable."""
    quotas = []
    with contextlib.suppress(OSError, ValueError):
        for line in PROC_CGROUP.read_text().splitlines():
            _, controllers, group = line.split(":", 2)
            if controllers and "cpu" not in controllers.split(","):
                continue
            v1 = bool(controllers)  # v1: a hierarchy per controller; v2 (0::PATH): one
            base = CGROUP_ROOT / "cpu" if v1 else CGROUP_ROOT
            names = ("cpu.cfs_quota_us", "cpu.cfs_period_us") if v1 else ("cpu.max",)
            for where in (base / group.lstrip("/"), *(base / group.lstrip("/")).parents):
                if where.is_relative_to(base) and all((where / n).is_file() for n in names):
                    quota, period = " ".join((where / n).read_text() for n in names).split()[:2]
                    if quota not in ("max", "-1"):
                        quotas.append(int(quota) / int(period))
    return min(quotas, default=None)


def usable_cores() -> int:
    """The CPU cores this process may use: its affinity (else the machine's), capped by its cgroup quota, rounded up."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpus()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


def set_threads(n_threads: int | None) -> None:
    """--threads: torch's intra-op threads (None or 0: torch's default), with a warning when they outnumber
    the usable cores (threads then take turns and every product waits for the slowest)."""
    if n_threads:
        cores = usable_cores()
        if n_threads > cores:
            logger.warning(
                "--threads %d is more than the %d CPU core(s) this process may use: the threads will take turns "
                "and run slower; --threads %d fits",
                n_threads,
                cores,
                cores,
            )
        torch.set_num_threads(n_threads)


def to_device_async(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor copied to `device` without the host waiting (on CUDA from pinned memory, non-blocking)."""
    if device.type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)


def choose_attention_backends(device: torch.device, cudnn_attention: bool) -> None:
    """Which kernels F.scaled_dot_product_attention may run on CUDA: cuDNN's only with --cudnn-attention. cuDNN
    plans every new (batch, length) shape, which with token-based batches made training and beam search several
    times slower (`benchmarks/bench_gpu.py`). Set on every device (they do nothing on CPU), logged on CUDA.
    """
    torch.backends.cuda.enable_flash_sdp(True)
    torch.backends.cuda.enable_mem_efficient_sdp(True)
    torch.backends.cuda.enable_math_sdp(True)
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    if device.type != "cuda":
        return
    if cudnn_attention:
        logger.info(
            "attention may use cuDNN (--cudnn-attention): it plans each new batch shape once, which pays only "
            "where shapes repeat"
        )
    else:
        logger.info("attention runs on flash, memory-efficient or math kernels (cuDNN's: --cudnn-attention)")


def environment_choice(variable: str, choices: tuple[str, ...]) -> str:
    """The environment variable's value, one of `choices` (the first when unset or empty); another value is a
    ConfigError naming the variable."""
    value = os.environ.get(variable, choices[0]) or choices[0]
    if value not in choices:
        raise ConfigError(f"{variable}={value!r}: expected one of {', '.join(choices)}")
    return value


AMP_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_has(feature: str) -> bool:
    """Whether this CPU has `feature` ("avx512", "vnni", "amx" or "bf16": oneDNN's bfloat16 products) as the
    libraries see it: the one place nmt reads CPU features. ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY and
    FBGEMM_ENABLE_INSTRUCTIONS cap the answer as on the older CPU they emulate (`make test-cpus`), which
    torch.cpu's own checks ignore.
    """
    if feature == "bf16":  # oneDNN's own check, under its cap
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    native = isa in ("ALL", "DEFAULT", "")
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    if not avx512 or not (native or isa.startswith(("AVX512", "AVX10"))):
        return False
    if feature == "vnni":
        fbgemm = os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper() in ("AVX2", "AVX512", "AVX512_256")
        return torch.cpu._is_vnni_supported() and isa != "AVX512_CORE" and not fbgemm
    if feature == "amx":
        return torch.cpu._is_amx_tile_supported() and (native or "AMX" in isa)
    return feature == "avx512"


def cpu_has_bf16() -> bool:
    """cpu_has("bf16"): whether oneDNN runs bfloat16 products on this CPU (PyTorch emulates them elsewhere)."""
    return cpu_has("bf16")


def resolve_precision(device: torch.device, precision: str | None, *, work: str = "training") -> str:
    """--precision, resolved once: by default bf16 on CUDA devices that support it, else fp32 (with TF32 matmuls
    on a GPU). `work` names what runs in it, for the warning where a CPU emulates bf16."""
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs a CUDA device; on CPU use --precision bf16")
    if precision is None:
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        precision = "bf16" if cuda_bf16 else "fp32"
    if device.type == "cpu" and precision == "bf16" and not cpu_has_bf16():
        logger.warning(
            "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX): bf16 runs through slow emulation "
            "here (%s many times slower than fp32); use --precision fp32",
            work,
        )
    if device.type == "cuda" and precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return precision


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> tuple[DistInfo, torch.device]:
    """Join the process group that torchrun describes in the environment (NCCL on CUDA, gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = choose_device(device_name, local_rank)
    if world_size == 1:
        return DistInfo(), device
    import datetime

    import torch.distributed as dist

    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(minutes=float(os.environ.get("NMT_DIST_TIMEOUT_MINUTES", "30")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timeout)
    info = DistInfo(dist.get_rank(), dist.get_world_size(), local_rank)
    return info, device


def shutdown_distributed() -> None:
    """Leave the process group, after every DDP wrapper is dropped. It must die here, where torch releases the GIL
    while gloo's threads are joined: a DDP reducer's destructor would join them holding it, a deadlock."""
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()  # a dropped DDP wrapper in a reference cycle goes now, while the group is alive
        dist.barrier()  # no rank leaves while another still talks to it
        dist.destroy_process_group()
