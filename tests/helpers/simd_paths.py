"""Each SIMD path the kernel in use can take, for tests that compare them bit for bit."""

from __future__ import annotations

import functools
import os

from llm_smolq._kernel import ffi, lib


@functools.cache
def amx_runs() -> bool:
    """Whether SMOLQ_SIMD=amx gives the AMX path here: a CPU with AMX whose OS lets this
    process use the tiles, or the SIMDe test build (tests/kernel/test_avx512vnni.py), whose
    tiles are C stand-ins. The setting in use is left as it was."""
    before = os.environ.get("SMOLQ_SIMD")
    os.environ["SMOLQ_SIMD"] = "amx"
    try:
        was = lib.sq_set_simd(1)
        name = ffi.string(lib.sq_simd_name()).decode()
    finally:
        if before is None:
            del os.environ["SMOLQ_SIMD"]
        else:
            os.environ["SMOLQ_SIMD"] = before
    lib.sq_set_simd(was)
    return name == "amx"


def simd_paths(monkeypatch):
    """Each SIMD path this CPU (or build) runs, as (name, setter): the best one (512-bit
    attention at the avx512vnni setting), the AMX tiles where they run (amx_runs), AVX2 held
    by SMOLQ_SIMD=avx2, and the plain code."""
    def use(env, on):
        def set_path():
            if env is None:
                monkeypatch.delenv("SMOLQ_SIMD", raising=False)
            else:
                monkeypatch.setenv("SMOLQ_SIMD", env)
            lib.sq_set_simd(on)
            return ffi.string(lib.sq_simd_name()).decode()
        return set_path
    return [use(None, 1), *([use("amx", 1)] if amx_runs() else []), use("avx2", 1), use(None, 0)]
