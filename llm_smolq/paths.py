"""Where llm-smolq keeps things on disk, every location in one place.

- models: ``llm.user_dir() / "smolq"`` (LLM_USER_PATH moves it): downloaded files under
  their upstream names, and ``models.json``, the registry of files added with `llm smolq add`;
- prompt cache: ``llm.user_dir() / "smolq-prompt-cache"`` (SMOLQ_PROMPT_CACHE_SIZE sets its
  budget, 0 turns it off);
- header cache (parsed GGUF headers, tokenizer files): $SMOLQ_CACHE_DIR, else the
  platform's user cache directory (platformdirs): ~/.cache/llm-smolq on Linux
  ($XDG_CACHE_HOME/llm-smolq when that is set), ~/Library/Caches/llm-smolq on macOS,
  %LOCALAPPDATA%\\llm-smolq\\Cache on Windows; SMOLQ_CACHE_DIR=off turns it off;
- packed weights: ``packed/`` of the header cache's directory (cache/packed_cache.py), with
  ``weights.index``, the digest of the weights of the model file states last loaded;
- llm's own aliases file, read to tell a user alias from ours: ``llm.user_dir() / "aliases.json"``.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

PROMPT_CACHE_DIR = "smolq-prompt-cache"
CACHE_APP_NAME = "llm-smolq"  # the header cache's folder in the platform's cache directory


def _llm_user_dir() -> Path:
    import llm  # llm itself is loaded by then; the engine's users need not load it

    return llm.user_dir()


def models_dir() -> Path:
    return _llm_user_dir() / "smolq"


def registry_file() -> Path:
    return models_dir() / "models.json"


def llm_aliases_file() -> Path:
    return _llm_user_dir() / "aliases.json"


def prompt_cache_dir() -> Path:
    return _llm_user_dir() / PROMPT_CACHE_DIR


def header_cache_dir() -> Path | None:
    """None when SMOLQ_CACHE_DIR=off."""
    chosen = os.environ.get("SMOLQ_CACHE_DIR")
    if chosen:
        return None if chosen.lower() == "off" else Path(chosen)
    # appauthor=False: no publisher folder above ours on Windows
    return Path(platformdirs.user_cache_dir(CACHE_APP_NAME, appauthor=False))
