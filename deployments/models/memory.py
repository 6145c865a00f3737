"""Hand freed heap memory back to the operating system after a large model call.

A forward pass over a big batch (32 texts x 256 tokens) allocates a few hundred MiB of
activations. glibc keeps what was freed in its heap for reuse, so a replica's RSS climbs to
the largest batch it ever ran and stays there (+360 MiB for the packaged MiniLM on a
mixed real-text load, levelling off after ~750 batches). ``malloc_trim(0)`` returns the free
pages; it costs a few milliseconds, so callers run it only after batches that large.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Any

logger = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Return free heap pages to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
