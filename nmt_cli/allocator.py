"""Process-wide memory allocator settings, applied once at start-up by the `nmt` command (no torch import)."""

from __future__ import annotations


def tune_allocator() -> None:
    """Keep freed memory in the process (glibc only) instead of returning it to the OS.

    By default glibc serves blocks over 128 KB with mmap and unmaps them when freed, so every large
    temporary tensor (the [rows, V] logits of each decoding step, activations of each batch) comes back
    as fresh pages that the kernel must fault in and zero. Raising the mmap and trim thresholds lets
    those blocks be reused: measured +25-30% beam-search speed on CPU. No effect elsewhere.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or "libc" not in name:
        return
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 << 20)  # glibc's maximum on 64-bit
        libc.mallopt(m_trim_threshold, 512 << 20)
    except (OSError, AttributeError):
        pass
