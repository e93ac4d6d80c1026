"""The changes fairseq-fixed 0.12.3.1's source needs for torch 2.11 and numpy 2, applied to an unpacked sdist
before fairseq_bundle.sh builds its wheel (a script rather than a diff: the sdist's files end their lines
with CRLF, which a diff kept in git does not carry reliably).

    python benchmarks/fairseq-bundle/patch_fairseq.py SRC_DIR

Each change replaces text that must occur exactly once in its file, so a different sdist fails here, naming
the file, instead of building a wheel that breaks on the GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

# (file, old, new): torch >= 2.6 loads with weights_only=True by default, which refuses fairseq's checkpoints
# (argparse and omegaconf objects inside); fairseq 0.12's --bf16 implies --tpu (bf16 was a TPU mode then),
# which fails on a CUDA device for want of torch_xla: with CUDA present --bf16 now trains there (its CUDA
# path is fairseq's own: bf16 weights, float32 master copy in FP16Optimizer, no loss scaling); numpy 2
# removed np.int and np.float.
CHANGES = [
    (
        "fairseq/options.py",
        "    if args.bf16:\r\n        args.tpu = True\r\n",
        "    if args.bf16 and not torch.cuda.is_available():\r\n        args.tpu = True\r\n",
    ),
    (
        "fairseq/checkpoint_utils.py",
        'state = torch.load(f, map_location=torch.device("cpu"))',
        'state = torch.load(f, map_location=torch.device("cpu"), weights_only=False)',
    ),
    (
        "fairseq/checkpoint_utils.py",
        'default_restore_location(s, "cpu")\r\n            ),\r\n        )',
        'default_restore_location(s, "cpu")\r\n            ),\r\n            weights_only=False,\r\n        )',
    ),
    (
        "fairseq/distributed/utils.py",
        'obj = torch.load(buffer, map_location="cpu")',
        'obj = torch.load(buffer, map_location="cpu", weights_only=False)',
    ),
    (
        "fairseq/modules/dynamic_crf_layer.py",
        'targets[:, :, None], np.float("inf")',
        'targets[:, :, None], float("inf")',
    ),
    (
        "fairseq/data/data_utils.py",
        "for s, e in parts),\r\n                    np.int,",
        "for s, e in parts),\r\n                    int,",
    ),
]


def main() -> None:
    src = Path(sys.argv[1])
    for name, old, new in CHANGES:
        path = src / name
        text = path.read_bytes().decode()
        count = text.count(old)
        # data_utils.py repeats the same mask code in two functions
        expected = 2 if name.endswith("data_utils.py") else 1
        if count != expected:
            sys.exit(f"patch_fairseq: {path} has {count} copies of {old!r}, not {expected}: another fairseq version?")
        path.write_bytes(text.replace(old, new).encode())
        print(f"patched {name}")


if __name__ == "__main__":
    main()
