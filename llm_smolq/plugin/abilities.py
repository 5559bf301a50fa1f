"""What a model's chat template cannot do, said the same way wherever it is refused: the
option or the tools left out, and the models that can (from the catalog: the known models
whose template has the switch, and the registered files checked to have it)."""

from __future__ import annotations

from llm_smolq.store import catalog

#: How str() names these models. llm puts it in its own refusal of tools ("SmolQ: smollm2-q
#: does not support tools"), which the wrapped commands reword (plugin/command.py).
NAME_PREFIX = "SmolQ: "


def _a_model_that_has(ability: str, model_id: str) -> str:
    names = [name for name in catalog.models_with(ability) if name != model_id]
    return "a SmolLM3 model" + (f" such as {' or '.join(names)}" if names else "")


def no_thinking_mode(model_id: str) -> str:
    return (f"{model_id} has no thinking mode (its chat template has no <think> switch): leave out -o thinking, "
            f"or use {_a_model_that_has('thinking', model_id)}, which has one")


def no_tools(model_id: str) -> str:
    names = [name for name in catalog.models_with("tools") if name != model_id]
    example = f", e.g. llm -m {names[0]} -T ..." if names else ""
    return (f"{model_id} does not support tools (its chat template has no tool format): "
            f"use {_a_model_that_has('tools', model_id)}{example}")
