"""Each SIMD path the kernel in use can take, for tests that compare them bit for bit."""

from __future__ import annotations

from llm_smolq._kernel import ffi, lib


def simd_paths(monkeypatch):
    """Each SIMD path this CPU (or build) runs, as (name, setter): the best one (512-bit
    attention at the avx512vnni setting), AVX2 held by SMOLQ_SIMD=avx2, and the plain code."""
    def use(env, on):
        def set_path():
            if env is None:
                monkeypatch.delenv("SMOLQ_SIMD", raising=False)
            else:
                monkeypatch.setenv("SMOLQ_SIMD", env)
            lib.sq_set_simd(on)
            return ffi.string(lib.sq_simd_name()).decode()
        return set_path
    return [use(None, 1), use("avx2", 1), use(None, 0)]
