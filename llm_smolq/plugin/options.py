"""The `llm -o` options of these models, their checks, and what they become: the engine
they ask for and the sampler settings. Defaults come from llm_smolq.defaults."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, ClassVar, Optional, Union

import llm
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from llm_smolq import defaults

if TYPE_CHECKING:
    from llm_smolq.decode.sampling import SamplingParams


class SmolQOptions(llm.Options):
    model_id: ClassVar[str] = "this model"

    max_tokens: Optional[int] = Field(
        default=None, ge=1, description=f"Most tokens to generate (default {defaults.MAX_TOKENS})"
    )
    temperature: Optional[float] = Field(
        default=None, ge=0.0, le=5.0, description="Sampling temperature; 0 is greedy (default per model card)"
    )
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, description="Nucleus sampling: keep this much probability")
    top_k: Optional[int] = Field(default=None, ge=0, description="Keep only the k likeliest tokens; 0 keeps all")
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0, description="Drop tokens below min_p x the top probability")
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0, le=5.0, description=f"Penalty for the last {defaults.REPEAT_WINDOW} tokens (1.0: off)")
    seed: Optional[int] = Field(default=None, ge=0, description="Random seed for reproducible sampling")
    stop: Optional[Union[str, list[str]]] = Field(
        default=None, description='Stop when this text appears; a JSON list of strings (\'["sea", "waves"]\') '
                                  'stops at any of them (text that itself reads as such a list: \'["[1, 2]"]\')'
    )
    n_ctx: Optional[int] = Field(
        default=None, ge=16, le=1 << 20,
        description="Context length in tokens (default: the model's whole window, as far as memory holds it)"
    )
    rope_scaling: Optional[str] = Field(
        default=None, description="yarn: extend the window with YaRN (by rope_scale, else n_ctx over the trained "
                                  "context, else 2x); none: turn off a file's own"
    )
    rope_scale: Optional[float] = Field(default=None, ge=1.0, le=1024.0, description="YaRN's factor")
    kv_cache: Optional[str] = Field(
        default=None, description=f"KV cache type: f16, q8_0 (about half f16's memory) or f32 (llama.cpp's exact "
                                  f"attention order); default {defaults.KV_CACHE}"
    )
    threads: Optional[int] = Field(default=None, ge=1, le=256, description="CPU threads (default: all cores)")
    prompt_cache: Optional[bool] = Field(
        default=None, description="Keep the prompt's state on disk so `llm -c` skips re-reading it "
                                  f"(default {str(defaults.PROMPT_CACHE).lower()})"
    )
    lookup: Optional[int] = Field(
        default=None, ge=0, le=64, description=f"Lookup decoding: draft up to N tokens from the prompt and the "
                                               f"answer so far and check them in one pass; same output, faster "
                                               f"where the answer repeats text (0: off; default {defaults.LOOKUP})"
    )
    repeat_guard: Optional[bool] = Field(
        default=None, description="End an answer that repeats the same span over and over for a few hundred "
                                  f"tokens, finish_reason 'repetition' (default {str(defaults.REPEAT_GUARD).lower()})"
    )

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_options_named(cls, data, handler):
        """An option the model does not have (`-o temprature 0.2`) is refused with the
        nearest name and the list, where pydantic only says "Extra inputs are not
        permitted"; every other error as pydantic words it."""
        try:
            return handler(data)
        except ValidationError as error:
            if not any(e["type"] == "extra_forbidden" for e in error.errors()):
                raise
            raise ValidationError.from_exception_data(error.title, [
                {"type": unknown_option(cls, str(e["loc"][0])) if e["type"] == "extra_forbidden"
                 else PydanticCustomError(e["type"], e["msg"]), "loc": e["loc"], "input": e["input"]}
                for e in error.errors()
            ]) from None

    @field_validator("kv_cache")
    @classmethod
    def _known_kv_cache(cls, value):
        from llm_smolq.engine.kv_types import KV_TYPES

        if value is not None and value not in KV_TYPES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_TYPES)}")
        return value

    @field_validator("rope_scaling")
    @classmethod
    def _known_rope_scaling(cls, value):
        if value is not None and value not in ("yarn", "none"):
            raise ValueError("rope_scaling must be yarn or none")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list_from_json(cls, value):
        # llm hands command-line values over as text: '["sea", "waves"]' means two stops
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                parsed = json.loads(value)
            except ValueError:
                return value
            if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
                return parsed
        return value

    @field_validator("stop")
    @classmethod
    def _stops_are_text(cls, value):
        stops = [value] if isinstance(value, str) else value
        if stops is not None and not all(stops):
            raise ValueError("stop strings must not be empty")
        return value


def unknown_option(options: type[SmolQOptions], name: str) -> PydanticCustomError:
    """The refusal of `-o name ...`: the option nearest that name, if one is near, and
    all of them (those `llm models --options` lists)."""
    names = list(options.model_json_schema()["properties"])
    near = difflib.get_close_matches(name, names, n=1)
    return PydanticCustomError("unknown_option", "{message}", {"message": (
        f"not an option of {options.model_id}" + (f": did you mean {near[0]}?" if near else ".")
        + f" Its options: {', '.join(names)} (`llm models list --options -m {options.model_id}` says what each does)"
    )})


class ThinkingOptions(SmolQOptions):
    """For models whose chat template has a <think> switch (SmolLM3)."""

    thinking: Optional[bool] = Field(default=None, description=f"Reason in <think> before answering (default {str(defaults.THINKING).lower()})")


class NoThinkingOptions(SmolQOptions):
    """For models whose chat template has no <think> switch (SmolLM2): `-o thinking` is
    refused saying so and naming models that have one, where pydantic would only say
    "Extra inputs are not permitted". The field is left out of `llm models --options`."""

    thinking: SkipJsonSchema[Optional[bool]] = None

    @field_validator("thinking", mode="before")
    @classmethod
    def _no_thinking_mode(cls, value):
        from llm_smolq.plugin.abilities import no_thinking_mode

        if value is None:
            return None
        raise PydanticCustomError("no_thinking_mode", no_thinking_mode(cls.model_id))


@cache
def options_for(model_id: str, thinking: bool) -> type[SmolQOptions]:
    """A model's options: ThinkingOptions where its template has a <think> switch, else
    NoThinkingOptions, naming `model_id` in their refusals."""
    base = ThinkingOptions if thinking else NoThinkingOptions
    return type(base.__name__, (base,), {"__module__": __name__, "model_id": model_id})


@dataclass(frozen=True)
class EngineOptions:
    """What an engine is made for: the options that change it (None: the defaults)."""

    n_ctx: int | None = None
    threads: int | None = None
    kv_cache: str | None = None
    rope_scaling: str | None = None
    rope_scale: float | None = None

    @classmethod
    def of(cls, opts) -> EngineOptions:
        return cls(opts.n_ctx, opts.threads, opts.kv_cache, opts.rope_scaling, opts.rope_scale)


def sampling_params(opts, arch: str) -> SamplingParams:
    """The options given, else the model card's recommendation for the architecture."""
    from llm_smolq.decode.sampling import SamplingParams

    card = defaults.SAMPLING_BY_ARCH[arch]
    return SamplingParams(
        temperature=pick(opts.temperature, card["temperature"]),
        top_p=pick(opts.top_p, card["top_p"]),
        top_k=pick(opts.top_k, defaults.TOP_K),
        min_p=pick(opts.min_p, defaults.MIN_P),
        repeat_penalty=pick(opts.repeat_penalty, defaults.REPEAT_PENALTY),
        seed=opts.seed,
    )


def stop_strings(opts) -> list[str]:
    return [opts.stop] if isinstance(opts.stop, str) else list(opts.stop or [])


def pick(value, default):
    """An option's value, or its default where it was not given."""
    return default if value is None else value
