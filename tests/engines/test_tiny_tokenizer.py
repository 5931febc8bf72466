"""The committed tiny tokenizer (scenarios/models/tiny-qwen3/tokenizer.json): what its recipe
(engines/vllm/tiny_tokenizer.py) makes, byte for byte, with the tiny models' vocabulary."""

import importlib.util
import json
import subprocess

import pytest

from conformance.formats.pins import load_pins
from conformance.process.envs import env_dir, env_python
from tests.helpers import REPO

FOLDER = REPO / "scenarios" / "models" / "tiny-qwen3"
SCRIPT = REPO / "engines" / "vllm" / "tiny_tokenizer.py"


def _load():
    spec = importlib.util.spec_from_file_location("tiny_tokenizer_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny_tokenizer = _load()


def test_the_vocabulary_is_the_recipes_and_the_tiny_models_size():
    committed = json.loads((FOLDER / "tokenizer.json").read_text(encoding="utf-8"))
    vocab, merges = tiny_tokenizer.vocabulary()
    assert committed["model"]["vocab"] == vocab
    assert [tuple(m) for m in committed["model"]["merges"]] == merges
    config = json.loads((FOLDER / "config.json").read_text(encoding="utf-8"))
    assert len(vocab) == config["vocab_size"] == tiny_tokenizer.VOCAB_SIZE == 2048
    names = {t["id"]: t["content"] for t in committed["added_tokens"]}
    assert names[config["eos_token_id"]] == "<|eos|>" and names[config["bos_token_id"]] == "<|bos|>"
    settings = json.loads((FOLDER / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert settings["eos_token"] == "<|eos|>"


def test_every_byte_is_a_token_and_words_are_whole():
    vocab, _ = tiny_tokenizer.vocabulary()
    table = tiny_tokenizer.byte_chars()
    assert len(set(table)) == 256 and all(vocab[c] == 3 + b for b, c in enumerate(table))
    for word in ("true", "maybe", "gamma", '{"', "42", "990"):
        assert word in vocab, word
    assert "Ġyes" in vocab  # " yes": a space is byte-level's Ġ


@pytest.mark.oracle
def test_the_recipe_regenerates_the_committed_files_byte_for_byte():
    """With the `tokenizers` of the oracle pin's environment (every pin holds the same)."""
    python = env_python(env_dir(load_pins().oracle))
    if not python.exists():
        pytest.skip(f"the oracle pin's environment is not built ({python}): `parity envs`")
    done = subprocess.run([str(python), str(SCRIPT), "--check", str(FOLDER)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # a folder without the files is not what the recipe makes
    other = REPO / "scenarios" / "models" / "tiny-dflash"
    assert subprocess.run([str(python), str(SCRIPT), "--check", str(other)], capture_output=True,
                          text=True).returncode == 1
