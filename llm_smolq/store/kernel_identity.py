"""Which build of the kernel this process runs: what the caches key their entries by.

Another build may round differently (kept KV states) or lay packed weights out
otherwise (kept packed matrices), so an entry made by one build is never read by another.
"""

from __future__ import annotations

import hashlib

_fingerprint: dict | None = None


def kernel_fingerprint() -> dict:
    """The compiled kernel's sha256 and the code path it picked."""
    global _fingerprint
    if _fingerprint is None:
        import llm_smolq._kernel as _kernel

        with open(_kernel.__file__, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest() if hasattr(hashlib, "file_digest") else \
                hashlib.sha256(f.read()).hexdigest()
        _fingerprint = {"sha256": digest, "simd": _kernel.ffi.string(_kernel.lib.sq_simd_name()).decode()}
    return _fingerprint
