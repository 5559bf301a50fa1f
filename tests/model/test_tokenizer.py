"""The GGUF tokenizer against llama.cpp's own token ids (tests/data/reference)."""

import json

import numpy as np
import pytest

from llm_smolq.errors import GGUFError
from helpers.reference_data import manifest, vocabulary_digest
from llm_smolq.model.tokenizer import (
    GGUFTokenizer,
    read_tokenizer_metadata,
)

# pre-type -> llama.cpp's ids for 253 strings. llama.cpp tokenized them with SmolLM2's
# vocabulary (49,152 tokens, 48,900 merges) under each split rule: the real SmolLM2 file for
# "smollm", and two files holding the same vocabulary under "smaug-bpe" and "llama-bpe".
# Those two are not kept: the tokenizers here are built from the real SmolLM2 file with the
# pre-type set, once the test below has shown that its vocabulary is theirs.
CASES = {
    "smollm": "smollm2-tokenizer-A.json",
    "smaug-bpe": "tokenizer-smaug-bpe-A.json",
    "llama-bpe": "tokenizer-llama-bpe-A.json",
}


@pytest.fixture(scope="module")
def tokenizers_by_pre(smollm2_gguf):
    meta = read_tokenizer_metadata(smollm2_gguf)
    built = {}

    def get(pre):
        if pre not in built:
            built[pre] = GGUFTokenizer.from_metadata({**meta, "tokenizer.ggml.pre": pre})
        return built[pre]

    return get


def load_cases(reference_dir, pre):
    data = json.loads((reference_dir / CASES[pre]).read_text())
    assert len(data["cases"]) == 253
    return data["cases"]


def test_the_smollm2_file_holds_the_vocabulary_llama_cpp_tokenized_with(smollm2_gguf, reference_dir):
    """Tokens, token types, merges, BOS/EOS/padding ids and add_bos_token hash to what
    llama.cpp's smaug-bpe and llama-bpe files held (their digest in generated.json)."""
    kept = manifest()["tokenizer_files"]
    assert vocabulary_digest(smollm2_gguf) == kept["vocabulary_sha256"]
    assert read_tokenizer_metadata(smollm2_gguf)["tokenizer.ggml.pre"] == "smollm"
    for name, pre in kept["pre"].items():  # where a complete reference folder is used
        if (reference_dir / name).exists():
            assert vocabulary_digest(reference_dir / name) == kept["vocabulary_sha256"]
            assert read_tokenizer_metadata(reference_dir / name)["tokenizer.ggml.pre"] == pre


@pytest.mark.parametrize("pre", list(CASES))
@pytest.mark.parametrize(
    "key,special", [("ids", False), ("ids_parse_special", True)]
)
def test_matches_llama_cpp(reference_dir, tokenizers_by_pre, pre, key, special):
    tok = tokenizers_by_pre(pre)
    wrong = [
        (case["text"], got, case[key])
        for case in load_cases(reference_dir, pre)
        if (got := tok.encode(case["text"], special=special)) != case[key]
    ]
    assert not wrong, f"{len(wrong)}/253 differ from llama.cpp, first: {wrong[0]!r}"


@pytest.mark.parametrize("pre", list(CASES))
def test_decode_round_trips(reference_dir, tokenizers_by_pre, pre):
    tok = tokenizers_by_pre(pre)
    for case in load_cases(reference_dir, pre):
        for key in ("ids", "ids_parse_special"):
            assert tok.decode(case[key]) == case["text"]
            # The tokenizers object's own ByteLevel decoder agrees.
            own = tok.tokenizer.decode(case[key], skip_special_tokens=False)
            assert own == case["text"]


def test_pre_types_really_differ(reference_dir):
    """Guard against a reference that could not tell the split rules apart."""
    smollm = load_cases(reference_dir, "smollm")
    llama3 = load_cases(reference_dir, "smaug-bpe")
    assert sum(a["ids"] != b["ids"] for a, b in zip(smollm, llama3)) == 178


def test_special_tokens(tokenizers_by_pre):
    tok = tokenizers_by_pre("smollm")
    text = "<|im_start|>user\nHi<|im_end|>"
    assert tok.encode(text, special=True)[0] == 1
    assert tok.encode(text, special=True)[-1] == 2
    plain = tok.encode(text)
    assert 1 not in plain and 2 not in plain
    assert tok.decode(plain) == tok.decode(tok.encode(text, special=True)) == text
    # special=False on decode drops control tokens, as llama.cpp's token_to_piece does.
    assert tok.decode(tok.encode(text, special=True), special=False) == "user\nHi"
    assert tok.token_to_piece(2) == "<|im_end|>"
    assert tok.token_id("<|im_end|>") == tok.eos_id == 2
    assert tok.vocab_size == 49152


def test_pieces_stream_as_bytes(tokenizers_by_pre):
    """A token can hold part of a UTF-8 character: joined bytes give the text back."""
    tok = tokenizers_by_pre("smollm")
    text = "emoji 🙂 and 日本語"
    ids = tok.encode(text)
    assert b"".join(tok.token_to_bytes(i) for i in ids).decode("utf-8") == text


def test_tiny_model_prompt(reference_dir):
    tok = GGUFTokenizer.from_gguf(reference_dir / "tiny-smollm3-Q8_0.gguf")
    ref = np.load(reference_dir / "tiny-smollm3-Q8_0.npz")
    assert tok.pre == "smollm" and tok.vocab_size == 1024
    assert tok.encode(str(ref["text"])) == ref["tokens"].tolist()
    assert tok.decode(ref["tokens"].tolist()) == str(ref["text"])
    assert (tok.bos_id, tok.eos_id) == (1, 2)


def test_not_a_gguf_is_a_clear_error(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"nope" * 8)
    with pytest.raises(GGUFError, match="not a GGUF"):
        read_tokenizer_metadata(path)


def tiny_meta(**changes):
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": [1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
    }
    meta.update(changes)
    return meta


def test_tiny_vocabulary_from_plain_values():
    tok = GGUFTokenizer.from_metadata(tiny_meta())
    assert tok.encode("abba") == [2, 1, 0]
    assert tok.add_bos is False


def test_unknown_pre_type_is_a_clear_error():
    with pytest.raises(GGUFError, match=r"'qwen2'.*smollm, smaug-bpe, llama-bpe"):
        GGUFTokenizer.from_metadata(tiny_meta(**{"tokenizer.ggml.pre": "qwen2"}))


def test_unsupported_tokenizer_model_is_a_clear_error():
    with pytest.raises(GGUFError, match=r"'llama'.*gpt2"):
        GGUFTokenizer.from_metadata(tiny_meta(**{"tokenizer.ggml.model": "llama"}))


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("tokenizer.ggml.tokens", 7, "tokenizer.ggml.tokens must be an array of strings"),
        ("tokenizer.ggml.tokens", ["a", 2, "ab"], "tokenizer.ggml.tokens must be an array of strings"),
        ("tokenizer.ggml.token_type", ["1", "1", "1"], "token_type must be an array of integers"),
        ("tokenizer.ggml.token_type", 1.5, "token_type must be an array of integers"),
        ("tokenizer.ggml.merges", [1, 2], "merges must be an array of strings"),
        ("tokenizer.ggml.bos_token_id", 3, "bos_token_id = 3 is not a token id (0 to 2)"),
        ("tokenizer.ggml.eos_token_id", -1, "eos_token_id = -1 is not a token id"),
        ("tokenizer.ggml.bos_token_id", "<|im_start|>", "is not a token id"),
        ("tokenizer.ggml.bos_token_id", float("inf"), "is not a token id"),
        ("tokenizer.ggml.bos_token_id", [1], "is not a token id"),
        ("tokenizer.ggml.add_bos_token", "yes", "add_bos_token = 'yes' must be a boolean"),
    ],
)
def test_metadata_of_the_wrong_type_is_a_clear_error(key, value, says):
    """What a damaged file can hold in place of each tokenizer key: a GGUFError, never a
    TypeError or OverflowError from deep inside."""
    with pytest.raises(GGUFError) as err:
        GGUFTokenizer.from_metadata(tiny_meta(**{key: value}))
    assert says in str(err.value)
