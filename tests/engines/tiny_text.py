"""What the tiny tokenizer's ids say as text, and whether a grammar accepts it: the grammar tests
judge outputs by their text (standard library: the recipe's vocabulary, engines/vllm/tiny_tokenizer.py)."""

import importlib.util
import json
import re
from functools import cache

from tests.helpers import REPO


@cache
def _tables() -> tuple[dict, dict, tuple]:
    spec = importlib.util.spec_from_file_location("tiny_tokenizer_text", REPO / "engines/vllm/tiny_tokenizer.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    vocab, _ = recipe.vocabulary()
    return {i: t for t, i in vocab.items()}, {c: b for b, c in enumerate(recipe.byte_chars())}, recipe.SPECIALS


def decode(ids: list[int]) -> str:
    """The text of `ids`, special tokens left out."""
    token, byte, specials = _tables()
    return b"".join(bytes(byte[c] for c in token[i]) for i in ids if token[i] not in specials).decode()


def follows(text: str, spec: dict) -> bool:
    """Whether `text` is what the workload's structured_output allows (the schemas the library uses:
    an object's required and known keys, a bounded string)."""
    if "regex" in spec:
        return re.fullmatch(spec["regex"], text) is not None
    if "choice" in spec:
        return text in spec["choice"]
    value, schema = json.loads(text), spec["json"]
    if schema["type"] == "object":
        return set(schema["required"]) <= set(value) <= set(schema["properties"])
    return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
