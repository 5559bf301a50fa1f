"""Models kept in memory between prompts: a chat's next turn, or a second get_model(),
reuses the weights and the KV cache instead of loading again."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import llm

from llm_smolq.plugin.options import EngineOptions

if TYPE_CHECKING:
    from llm_smolq.chat.template import ChatTemplate
    from llm_smolq.engine.engine import Engine


@dataclass
class Loaded:
    """A model file in memory: its engine (weights + KV cache), chat template, and the
    lock that lets one generation at a time use the cache."""

    engine: Engine
    template: ChatTemplate
    made_for: EngineOptions  # the options it was loaded for
    lock: threading.Lock = field(default_factory=threading.Lock)


in_memory: dict[str, Loaded] = {}  # by the model file's resolved path
_loaded_lock = threading.Lock()


def load_model(path: Path, want: EngineOptions) -> Loaded:
    """The model at path with an engine as `want` asks (n_ctx None: the whole window, as
    far as memory holds it), reusing the loaded one when it was made the same way."""
    from llm_smolq.chat.template import chat_template_from_metadata
    from llm_smolq.engine.engine import Engine
    from llm_smolq.engine.kv_types import DEFAULT_KV_TYPE
    from llm_smolq.model.model_file import open_model

    key = str(path.resolve())
    with _loaded_lock:
        hit = in_memory.get(key)
        if hit and replace(hit.made_for, threads=None) == replace(want, threads=None) and want.threads in (
                None, hit.engine.threads):
            return hit
        in_memory.pop(key, None)  # let a differently sized engine go before loading another
        try:
            model = open_model(path)
            engine = Engine(model, n_ctx=want.n_ctx, threads=want.threads, kv_dtype=want.kv_cache or DEFAULT_KV_TYPE,
                            rope_scaling=want.rope_scaling, rope_scale=want.rope_scale)
            engine.tokenizer  # built now, so a broken vocabulary is refused with the rest
            template = chat_template_from_metadata(model.metadata)
        except ValueError as exc:  # GGUFError, ResourceError, ChatTemplateError and bad sizes
            raise llm.ModelError(str(exc)) from None
        in_memory[key] = Loaded(engine, template, want)
        return in_memory[key]
