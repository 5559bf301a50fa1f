"""Makes tests/data/yarn-tiny-Q8_0.npz: llama.cpp's logits for the tiny SmolLM3 model with
YaRN, the reference test_yarn.py compares with. Run it by hand where llama-cpp-python is
installed (the `bench` extra), from the repository's root:

    python tests/engine/make_yarn_reference.py

Two cases on tiny-smollm3-Q8_0.gguf with its context_length cut to 512 (yarn_files()
writes both GGUFs, the same bytes the test builds):
- "declared": the file says rope.scaling.type = yarn, factor 4, original context 512;
- "asked": the file says nothing, and YaRN by 4 is asked for (llama.cpp's context
  parameters, as `-o rope_scaling yarn -o n_ctx 2048` asks this engine).
For each: 1,200 random prompt ids fed in batches of 512 (past the trained 512 positions),
then 8 greedy steps, F32 KV cache; kept are the prompt rows ROWS and every greedy step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFValueType as V

from llm_smolq.dev.gguf_mutations import with_metadata

HERE = Path(__file__).resolve().parents[1]  # tests/
OUT = HERE / "data" / "yarn-tiny-Q8_0.npz"
CONTEXT, FACTOR, N_CTX = 512, 4.0, 2048
ROWS = [0, 63, 255, 511, 512, 700, 1023, 1024, 1100, 1199]
STEPS = 8


def prompt_ids() -> list[int]:
    return np.random.default_rng(7).integers(3, 1000, 1200).tolist()


def yarn_files(source: Path, directory: Path) -> dict[str, Path]:
    """The two GGUFs: context cut to CONTEXT, with and without YaRN declared."""
    data = source.read_bytes()
    short = {"smollm3.context_length": (V.UINT32, CONTEXT)}
    declared = {**short, "smollm3.rope.scaling.type": (V.STRING, "yarn"),
                "smollm3.rope.scaling.factor": (V.FLOAT32, FACTOR),
                "smollm3.rope.scaling.original_context_length": (V.UINT32, CONTEXT)}
    paths = {"declared": directory / "tiny-yarn-declared.gguf", "asked": directory / "tiny-yarn-asked.gguf"}
    paths["declared"].write_bytes(with_metadata(data, declared))
    paths["asked"].write_bytes(with_metadata(data, short))
    return paths


def run_llama_cpp(path: Path, asked: bool) -> dict[str, np.ndarray]:
    import llama_cpp

    scaling = {"rope_scaling_type": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN, "rope_freq_scale": 1 / FACTOR,
               "yarn_orig_ctx": CONTEXT} if asked else {}
    model = llama_cpp.Llama(model_path=str(path), n_ctx=N_CTX, n_batch=512, n_threads=2, logits_all=True,
                            verbose=False, type_k=0, type_v=0, flash_attn=False, **scaling)
    tokens = prompt_ids()
    for i in range(0, len(tokens), 512):
        model.eval(tokens[i:i + 512])
    rows = np.array(model.scores[:len(tokens)], np.float32)
    steps, greedy = [rows[-1]], []
    for _ in range(STEPS):
        greedy.append(int(steps[-1].argmax()))
        model.eval([greedy[-1]])
        steps.append(np.array(model.scores[model.n_tokens - 1], np.float32))
    return {"rows": rows[ROWS], "greedy": np.array(greedy, np.int32), "greedy_logits": np.stack(steps[:-1])}


def main() -> None:
    import tempfile

    import llama_cpp

    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(HERE))
        from helpers.reference_data import materialize

        source = materialize(HERE.parent / ".models" / "reference") / "tiny-smollm3-Q8_0.gguf"
        paths = yarn_files(source, Path(tmp))
        out = {"tokens": np.array(prompt_ids(), np.int32), "row_index": np.array(ROWS, np.int32),
               "llama_cpp_python": np.array(llama_cpp.__version__)}
        for case, path in paths.items():
            for key, value in run_llama_cpp(path, case == "asked").items():
                out[f"{case}_{key}"] = value
    OUT.parent.mkdir(exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
