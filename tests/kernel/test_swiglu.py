"""SwiGLU (sq_swiglu, native/forward.c): the SIMD path gives the plain path's bits, lane by
lane, including the values where llama.cpp's exp takes its other branch (|gate| past
about 87) and the tail of a row that is not a multiple of eight; both are SiLU(gate) * up."""

from __future__ import annotations

import numpy as np
from test_quants import native_simd

from llm_smolq._kernel import ffi, lib


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    out = gate.copy()
    lib.sq_swiglu(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", up), len(out))
    return out


def test_every_path_gives_the_same_bits(simd_restore):
    rng = np.random.default_rng(11)
    special = np.array([0.0, -0.0, 1e-40, -1e-40, 1e-3, 86.9, 87.5, 88.0, -87.5, -88.0, 100.0, -100.0, 130.0, -130.0,
                        200.0, -200.0, np.inf, -np.inf, np.nan, 3.4e38, -3.4e38], dtype=np.float32)
    for n in (0, 1, 7, 8, 9, 37, 4096 + 5):
        gate = rng.standard_normal(n).astype(np.float32) * rng.choice([1, 10, 60, 120], n).astype(np.float32)
        if n >= len(special):
            gate[rng.choice(n, len(special), replace=False)] = special
        up = rng.standard_normal(n).astype(np.float32)
        results = []
        for simd in (1, 0) if native_simd() else (0,):
            lib.sq_set_simd(simd)
            results.append(swiglu(gate, up))
        assert all(r.tobytes() == results[0].tobytes() for r in results), n
        finite = np.isfinite(gate) & (np.abs(gate) < 80)
        x = gate[finite].astype(np.float64)
        want = x / (1 + np.exp(-x)) * up[finite]
        assert np.allclose(results[0][finite], want, rtol=1e-5, atol=1e-30)
