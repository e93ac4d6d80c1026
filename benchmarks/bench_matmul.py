"""Float32 GFLOP/s of the three products of a Linear layer in training, at transformer_base shapes.

Compares PyTorch's default CPU route (MKL) with model/linear.py's route (oneDNN, rows padded), on
2 threads: forward y = x W^T, input gradient g W, weight gradient g^T x. This is why training goes
through oneDNN on AMD's AVX-512 CPUs: MKL picks kernels by CPU vendor (AVX2 code on AMD's), oneDNN by
instruction set. On AVX2-only CPUs and on Intel's MKL measured faster and float32 training keeps it; the
oneDNN columns measure oneDNN on every CPU, and the last line says which route training takes on this one.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import report

from nmt_cli.model import linear
from nmt_cli.model.linear import matmul_nt, pad_rows


def gflops(fn, flops: float, repeat: int) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return flops * repeat / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=3000, help="tokens in the batch [default: 3000]")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    training_route = "oneDNN" if linear._ONEDNN and torch.float32 in linear._DTYPES else "PyTorch's default (MKL)"
    # the oneDNN columns measure oneDNN on any CPU
    linear._ONEDNN, linear._DTYPES = linear.ONEDNN_AVAILABLE, (torch.float32,)
    rows = []
    for k, n in [(512, 1536), (512, 512), (512, 2048), (2048, 512)]:
        x, w, g = torch.randn(args.rows, k), torch.randn(n, k), torch.randn(args.rows, n)
        xp, gp = pad_rows(x), pad_rows(g)
        flops = 2.0 * args.rows * k * n
        rows.append(
            {
                "in x out": f"{k} x {n}",
                "mkl fwd": gflops(lambda: x @ w.t(), flops, args.repeat),
                "onednn fwd": gflops(lambda: matmul_nt(pad_rows(x), w), flops, args.repeat),
                "mkl grad_x": gflops(lambda: g @ w, flops, args.repeat),
                "onednn grad_x": gflops(lambda: matmul_nt(pad_rows(g), w.t()), flops, args.repeat),
                "mkl grad_w": gflops(lambda: g.t() @ x, flops, args.repeat),
                "onednn grad_w": gflops(lambda: matmul_nt(gp.t(), xp.t()), flops, args.repeat),
            }
        )
    report("matmul", rows)
    print(
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {linear.cpu_vendor() or 'vendor unknown'}: "
        f"training's float32 products take {training_route}"
    )


if __name__ == "__main__":
    main()
