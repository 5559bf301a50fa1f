"""A built wheel's smoke test (cibuildwheel's test-command, run outside the checkout so that
the installed wheel is what imports): one attention step on the CPU's SIMD path and on the
plain C one, which must both give the values back unchanged."""

import numpy as np

from llm_smolq import kernel
from llm_smolq._kernel import ffi, lib

v = np.arange(64, dtype=np.float32).reshape(1, 1, 64)
for simd in (1, 0):
    lib.sq_set_simd(simd)
    out = kernel.attention(np.ones((2, 64), np.float32), v, v.copy(), 1)
    assert (out == v[0]).all(), out
    print("llm-smolq kernel ok:", ffi.string(lib.sq_simd_name()).decode())
