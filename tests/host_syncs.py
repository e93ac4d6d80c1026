"""A CPU twin of `torch.cuda.set_sync_debug_mode`: the tensor calls that make the host wait for a CUDA device,
recorded on any device, with the line of nmt that made them.

On CUDA these calls wait for the device: reading values on the host (`item`, `int()`, `bool()`, `tolist`,
`.cpu()`; `.numpy()` refuses a CUDA tensor, so it only ever reads the host's), shapes that depend on values (`nonzero`, boolean-mask indexing, `masked_select`,
`unique`, `repeat_interleave` with a tensor of repeats), and a Python number written through tensor indices
(PyTorch makes it a CPU tensor and copies it to the device with a blocking copy). What the twin cannot see:
copies between host and device (`.to(device)`, `torch.tensor(..., device=)`: on CPU they copy nothing) and
waits inside libraries (cuDNN building a plan); tests/test_gpu.py counts those on a GPU.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

NMT_CLI = str(Path(__file__).resolve().parents[1] / "nmt_cli")
READS = {"item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__"}
VALUE_SHAPED = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"}


def has_tensor(index: object, bool_only: bool = False) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(
        isinstance(i, torch.Tensor) and (i.dtype == torch.bool if bool_only else i.dim() > 0 or i.dtype == torch.bool)
        for i in items
    )


def waits(name: str, args: tuple) -> bool:
    """Whether the tensor call `name` with `args` would wait for a CUDA device."""
    if name in READS or name in VALUE_SHAPED:
        return True
    if name == "__getitem__":
        return has_tensor(args[1], bool_only=True)
    if name == "__setitem__":
        return has_tensor(args[1], bool_only=True) or (has_tensor(args[1]) and isinstance(args[2], (int, float)))
    if name == "repeat_interleave":
        return len(args) > 1 and isinstance(args[1], torch.Tensor)
    if name == "where":
        return len(args) == 1
    return False


@dataclass
class SyncLog(TorchFunctionMode):
    """Use as a context manager; `syncs` holds (call, "file.py:line in function") for each call of nmt_cli's
    that would wait for a CUDA device (calls made inside another recorded call are not counted again)."""

    syncs: list[tuple[str, str]] = field(default_factory=list)
    depth: int = 0

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = getattr(func, "__name__", str(func))
        if self.depth == 0 and waits(name, args):
            self.syncs.append((name, caller()))
        self.depth += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.depth -= 1


def caller() -> str:
    """The innermost frame in nmt_cli that led here."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(NMT_CLI):
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return "outside nmt_cli"
