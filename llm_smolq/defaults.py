"""Every default a user can change, in one table: the `llm -o` options, `llm_smolq.load`
and the sampler read them from here. Plain values only, so `llm` starts without loading
numpy or the kernel."""

#: Most tokens one answer generates (-o max_tokens).
MAX_TOKENS = 1024

#: Sampling as each model card recommends (-o temperature, -o top_p), by GGUF architecture.
SAMPLING_BY_ARCH = {
    "smollm3": {"temperature": 0.6, "top_p": 0.95},
    "llama": {"temperature": 0.2, "top_p": 0.9},  # SmolLM2
}
TOP_K = 0              # 0: no top-k cut
MIN_P = 0.0            # 0: no min-p cut
REPEAT_PENALTY = 1.0   # 1.0: off
REPEAT_WINDOW = 64     # tokens the repeat penalty looks back over, as llama.cpp's default

#: The KV cache's element type (-o kv_cache, load(kv_dtype=...)): halves, as llama.cpp.
KV_CACHE = "f16"

#: Lookup decoding (-o lookup N): at most this many tokens drafted from the text so far
#: and checked in one batch; 0 turns it off. The output is the same either way.
LOOKUP = 8

PROMPT_CACHE = True    # -o prompt_cache: keep prompt states on disk for `llm -c`
REPEAT_GUARD = True    # -o repeat_guard: end an answer caught in a loop
THINKING = True        # -o thinking: SmolLM3 reasons in <think> first

# n_ctx: the model's whole window, as far as memory holds its cache (engine.default_n_ctx);
# threads: $SMOLQ_THREADS, else every core this process may run on (engine.default_threads).
