"""The C views of a model that the kernel reads (smolq.h's structs), built in one place."""

from __future__ import annotations

from typing import Any

from llm_smolq._kernel import ffi
from llm_smolq.model.model_file import ModelConfig


def c_config(c: ModelConfig, n_ctx: int) -> Any:
    """An `sq_config *` for this model with a KV cache of n_ctx positions."""
    yarn = c.rope_scaling
    return ffi.new("sq_config *", {
        "dim": c.dim, "hidden_dim": c.hidden_dim, "n_layers": c.n_layers, "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
        "n_ctx": n_ctx, "rope_theta": c.rope_theta, "rms_eps": c.rms_eps,
        **({"yarn_freq_scale": 1.0 / yarn.factor, "yarn_orig_ctx": yarn.original_context,
            "yarn_beta_fast": yarn.beta_fast, "yarn_beta_slow": yarn.beta_slow} if yarn else {}),
    })
