"""One thread's speed in a model's quantized mat-vecs, from the file's layout and packed.

    python -m llm_smolq.dev.bench MODEL.gguf --kernels [1,2,4,8,9] [--repeat R] [--json]

For each quantized type among the model's matrices, its largest matrix times k activation
rows, every output with one-token bits (k = 1: a decode step; more: a lookup draft's
check), on the calling thread alone: once as the file lays the rows out, and once packed
sixteen rows side by side (native/quants/rows16.c) where the kernel path in use reads that
type packed (sq_rows16_wanted). Each is reported as GB/s of weights read, the best of R
passes (a matrix larger than the last-level cache streams from memory; a smaller one is
read from cache after the first pass), with whether the two layouts gave the same bits
(they must).

    python -m llm_smolq.dev.bench MODEL.gguf --kernels [K,...] --against OTHER/_kernel.abi3.so

With --against, another build of the kernel (say, main's, built with cffi_build/build_kernel.py
in another checkout) is loaded beside this one, and each product goes through the two in
turn, call by call, 10 x R times: a machine whose speed drifts by the minute moves both
alike, where runs in separate processes minutes apart can differ by more than a change does.
Each type's matrix is read in the layout this build reads it in; the medians, their ratio
and whether the two builds gave the same bits.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path

import numpy as np

from llm_smolq._kernel import ffi, lib
from llm_smolq.model.model_file import ModelFile, TensorInfo, open_model

FLOAT_TYPES = {"F32", "F16", "BF16"}


def _largest_matrices(path: str) -> tuple[ModelFile, dict[str, TensorInfo]]:
    """The opened model, and for each quantized type among its matrices the largest one."""
    model = open_model(path)
    largest: dict[str, TensorInfo] = {}
    for info in model.tensors.values():
        name = info.type.name
        if len(info.shape) == 2 and name not in FLOAT_TYPES and lib.sq_vec_dot_type(int(info.type)) >= 0:
            if name not in largest or info.n_bytes > largest[name].n_bytes:
                largest[name] = info
    return model, largest


def _activations(vec_type: int, cols: int, tokens: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """tokens rows of random activations in the vec-dot format, and the bytes of one row."""
    row_bytes = lib.sq_activation_row_bytes(vec_type, cols)
    xq = np.zeros(tokens * row_bytes, np.uint8)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    for t in range(tokens):
        lib.sq_quantize_activations(vec_type, ffi.from_buffer("float[]", x[t]), ffi.from_buffer(xq[t * row_bytes:]),
                                    cols)
    return xq, row_bytes


def _packed_copy(info: TensorInfo, weights) -> np.ndarray | None:
    """The matrix packed sixteen rows side by side, where the kernel path in use reads its
    type so (sq_rows16_wanted); else None."""
    qtype, cols, rows = int(info.type), info.shape[0], info.rows
    if not (rows % 16 == 0 and lib.sq_rows16_packs(qtype) and lib.sq_rows16_wanted(qtype)):
        return None
    packed = np.empty(info.n_bytes, np.uint8)
    if lib.sq_rows16_pack(qtype, ffi.from_buffer(weights), ffi.from_buffer(packed), rows, cols) != 0:
        raise RuntimeError(f"the kernel would not pack {info.name}")
    return packed


def _best_seconds(call, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        if call() != 0:
            raise RuntimeError("the kernel refused a product it was given")
        best = min(best, time.perf_counter() - start)
    return best


def measure(path: str, tokens: list[int], repeat: int) -> dict:
    model, largest = _largest_matrices(path)
    rng = np.random.default_rng(0)
    report: dict = {"model": path, "simd": ffi.string(lib.sq_simd_name()).decode(), "repeat": repeat, "types": {}}
    for type_name, info in sorted(largest.items()):
        qtype, cols, rows = int(info.type), info.shape[0], info.rows
        weights = model.data[info.offset:info.offset + info.n_bytes]
        packed = _packed_copy(info, weights)
        entry = {"matrix": info.name, "rows": rows, "cols": cols, "mb": info.n_bytes / 1e6, "tokens": {}}
        for k in tokens:
            xq, xq_bytes = _activations(lib.sq_vec_dot_type(qtype), cols, k, rng)
            w, x = ffi.from_buffer(weights), ffi.from_buffer(xq)
            plain_y, packed_y = np.zeros((k, rows), np.float32), np.zeros((k, rows), np.float32)
            y = ffi.from_buffer("float[]", plain_y)
            if k == 1:
                plain = _best_seconds(lambda: lib.sq_vec_dot_rows(qtype, w, info.row_bytes, rows, x, cols, y), repeat)
            else:
                plain = _best_seconds(lambda: lib.sq_vec_dot_batch_rows(qtype, w, info.row_bytes, rows, x, xq_bytes, k,
                                                                        cols, y, rows), repeat)
            row = {"file_gb_s": info.n_bytes / plain / 1e9}
            if packed is not None:
                p, py = ffi.from_buffer(packed), ffi.from_buffer("float[]", packed_y)
                seconds = _best_seconds(lambda: lib.sq_vec_dot_rows16(qtype, p, 0, rows, x, xq_bytes, k, cols, py, rows),
                                          repeat)
                row["packed_gb_s"] = info.n_bytes / seconds / 1e9
                row["same_bits"] = plain_y.tobytes() == packed_y.tobytes()
            entry["tokens"][str(k)] = row
        report["types"][type_name] = entry
    return report


def load_build(path: str):
    """Another build of the kernel, loaded beside the one in use as a module of its own."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no kernel build at {path}: give the path of a _kernel*.so (or .pyd) that "
                                f"cffi_build/build_kernel.py made")
    spec = importlib.util.spec_from_file_location("llm_smolq._kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_against(path: str, tokens: list[int], repeat: int, other_path: str) -> dict:
    """Each quantized type's largest matrix times k tokens through this build and another,
    alternating call by call, 10 * repeat calls each: the medians' GB/s and their ratio."""
    other = load_build(other_path)
    builds = ((ffi, lib), (other.ffi, other.lib))
    model, largest = _largest_matrices(path)
    rng = np.random.default_rng(0)
    report: dict = {"model": path, "against": str(other_path), "calls": 10 * repeat,
                    "simd": [ffi.string(l.sq_simd_name()).decode() for _, l in builds], "types": {}}
    for type_name, info in sorted(largest.items()):
        qtype, cols, rows = int(info.type), info.shape[0], info.rows
        weights = np.array(model.data[info.offset:info.offset + info.n_bytes])
        packed_copy = _packed_copy(info, weights)
        packed = packed_copy is not None
        data = packed_copy if packed else weights
        entry = {"matrix": info.name, "rows": rows, "cols": cols, "mb": info.n_bytes / 1e6,
                 "layout": "packed" if packed else "file", "tokens": {}}
        for k in tokens:
            xq, xq_bytes = _activations(lib.sq_vec_dot_type(qtype), cols, k, rng)
            outs = [np.zeros((k, rows), np.float32) for _ in builds]
            seconds: list[list[float]] = [[], []]
            for _ in range(10 * repeat):
                for b, (f, l) in enumerate(builds):
                    w, x, y = f.from_buffer(data), f.from_buffer(xq), f.from_buffer("float[]", outs[b])
                    start = time.perf_counter()
                    rc = (l.sq_vec_dot_rows16(qtype, w, 0, rows, x, xq_bytes, k, cols, y, rows) if packed else
                          l.sq_vec_dot_batch_rows(qtype, w, info.row_bytes, rows, x, xq_bytes, k, cols, y, rows))
                    seconds[b].append(time.perf_counter() - start)
                    if rc != 0:
                        raise RuntimeError("a kernel refused a product it was given")
            this, that = (statistics.median(s) for s in seconds)
            entry["tokens"][str(k)] = {"this_gb_s": info.n_bytes / this / 1e9, "other_gb_s": info.n_bytes / that / 1e9,
                                       "speedup": that / this, "same_bits": outs[0].tobytes() == outs[1].tobytes()}
        report["types"][type_name] = entry
    return report


def format_against(r: dict) -> str:
    lines = [f"{r['model']}: one thread, this build ({r['simd'][0]} kernels) against {r['against']} "
             f"({r['simd'][1]}), medians of {r['calls']} calls each in turn, GB/s of weights read"]
    for type_name, e in r["types"].items():
        lines.append(f"  {type_name}: {e['matrix']} ({e['rows']} x {e['cols']}, {e['mb']:.1f} MB, {e['layout']} layout)")
        for k, row in e["tokens"].items():
            lines.append(f"    {int(k):2d} tokens: this {row['this_gb_s']:.2f}, other {row['other_gb_s']:.2f}, "
                         f"x{row['speedup']:.3f}, same bits: {'yes' if row['same_bits'] else 'NO'}")
    return "\n".join(lines)


def format_report(r: dict) -> str:
    lines = [f"{r['model']}: one thread, the {r['simd']} kernels, best of {r['repeat']}, GB/s of weights read"]
    for type_name, e in r["types"].items():
        lines.append(f"  {type_name}: {e['matrix']} ({e['rows']} x {e['cols']}, {e['mb']:.1f} MB)")
        for k, row in e["tokens"].items():
            text = f"    {int(k):2d} tokens: file's layout {row['file_gb_s']:.2f}"
            if "packed_gb_s" in row:
                text += (f", packed {row['packed_gb_s']:.2f} (x{row['packed_gb_s'] / row['file_gb_s']:.2f}), "
                         f"same bits: {'yes' if row['same_bits'] else 'NO'}")
            lines.append(text)
    return "\n".join(lines)
