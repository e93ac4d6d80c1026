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
    """Keep freed memory in the process (glibc only): glibc unmaps freed blocks over 128 KB, so every large
    temporary tensor came back as fresh pages for the kernel to fault in and zero (`benchmarks/bench_generate.py`).
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
    """Ask the kernel to reclaim the pages of tensor `t`'s data (Linux only), for memory-mapped weights once copied
    into packed or int8 form. MADV_PAGEOUT loses no data: a clean file page is read again if touched.
    """
    libc = _libc()
    if libc is None or t.device.type != "cpu" or not sys.platform.startswith("linux") or t.numel() == 0:
        return
    start = t.untyped_storage().data_ptr()
    end = start + t.untyped_storage().nbytes()
    first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        libc.madvise(first, last - first, _MADV_PAGEOUT)  # an older kernel answers EINVAL: nothing happens
