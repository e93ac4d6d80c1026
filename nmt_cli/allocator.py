"""Process memory: glibc allocator settings, applied once at start-up by the `nmt` command, and pages
given back to the kernel once their contents live elsewhere. No torch import."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

_MADV_PAGEOUT = 21  # Linux 5.4 and later


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, loaded once; None where there is none to load."""
    name = ctypes.util.find_library("c")
    if not name or "libc" not in name:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def tune_allocator() -> None:
    """Keep freed memory in the process (glibc only) instead of returning it to the OS.

    By default glibc serves blocks over 128 KB with mmap and unmaps them when freed, so every large
    temporary tensor (the [rows, V] logits of each decoding step, activations of each batch) comes back
    as fresh pages that the kernel must fault in and zero. Raising the mmap and trim thresholds lets
    those blocks be reused, which speeds up CPU beam search (`benchmarks/bench_generate.py`). No effect
    elsewhere.
    """
    libc = _libc()
    if libc is None:
        return
    try:
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum on 64-bit
        libc.mallopt(m_trim_threshold, 512 << 20)
    except AttributeError:
        pass


def release_pages(t: Tensor) -> None:
    """Ask the kernel to reclaim the memory pages that hold tensor `t`'s data (Linux; elsewhere this does
    nothing).

    For weights memory-mapped from a checkpoint (`load_checkpoint`) once they have been copied into packed
    or int8 form: their pages would otherwise stay resident, and count in the process's memory, until the
    checkpoint's last tensor is gone. MADV_PAGEOUT loses no data: a clean file page is read again if it is
    touched, an anonymous page is swapped out or simply kept.
    """
    libc = _libc()
    if libc is None or t.device.type != "cpu" or not sys.platform.startswith("linux") or t.numel() == 0:
        return
    start = t.untyped_storage().data_ptr()
    end = start + t.untyped_storage().nbytes()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        libc.madvise(first, last - first, _MADV_PAGEOUT)  # an older kernel answers EINVAL: nothing happens
