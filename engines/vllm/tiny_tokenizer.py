"""The tiny tokenizer the project makes itself: scenarios/models/tiny-qwen3/tokenizer.json and tokenizer_config.json, byte-identical.

Structured outputs need text: a grammar judges what token ids decode to. The stand-in's token ids
are those of the tiny models (vocabulary 2048, scenarios/models/tiny-qwen3/config.json), so this
tokenizer has exactly 2048 entries, built from a fixed recipe with the `tokenizers` library (the
version every pin environment holds, engines/vllm/requirements-cpu.txt). Nothing is fetched.

The recipe (a byte-level BPE, as GPT-2 and Qwen tokenizers are):

    ids 0, 1, 2     "<|pad|>", "<|bos|>", "<|eos|>" (special; bos 1 and eos 2 as the tiny
                    models' config.json says)
    ids 3..258      the 256 byte-level characters, in byte order (every text is encodable)
    ids 259..2047   multi-character tokens from POOL, in order, each with every prefix before
                    it (the merge of a token is its prefix and its last character)

    python engines/vllm/tiny_tokenizer.py --write scenarios/models/tiny-qwen3
    python engines/vllm/tiny_tokenizer.py --check scenarios/models/tiny-qwen3   # exit 1 if not identical

The reasoning variant (scenarios/models/reasoning-tokenizer, a scenario's `engine_args.tokenizer`
beside the tiny target, for a `reasoning_parser`): the same recipe up to id 2045, then
THINK's two tokens as ids 2046 "<think>" and 2047 "</think>" (added tokens, not special, as
Qwen3's and DeepSeek-R1's tokenizers hold them), so the release's deepseek_r1 reasoning parser
finds its start and end tokens. The tiny target's own tokenizer stays as it was: the grammar
scenarios' hashes and goldens do not move.

    python engines/vllm/tiny_tokenizer.py --reasoning --write scenarios/models/reasoning-tokenizer
    python engines/vllm/tiny_tokenizer.py --reasoning --check scenarios/models/reasoning-tokenizer
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 2048
SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")
FILES = ("tokenizer.json", "tokenizer_config.json")
THINK = ("<think>", "</think>")  # the reasoning variant's last two ids (module doc)

# What the multi-character tokens are made of: JSON's punctuation, words a schema, a regex or a
# choice uses, and numbers, each also after a space. Order decides the ids.
PUNCTUATION = ['{"', '"}', '":', '",', '": ', '", "', '{ "', '" }', '[{', '}]', '},', '["', '"]', '],',
               '{}', '[]', ', ', ': ', '\n', '\n  ', '  ', '    ', '":"', '","', '{"a', '@', '.com', '.org']
WORDS = ["true", "false", "null", "yes", "no", "maybe", "red", "green", "blue", "name", "age", "city",
         "id", "ok", "error", "value", "items", "count", "score", "tags", "type", "user", "admin", "guest",
         "email", "status", "done", "open", "closed", "alpha", "beta", "gamma", "delta", "north", "south",
         "east", "west", "cat", "dog", "bird", "fish", "one", "two", "three", "four", "five", "hello",
         "world", "json", "data", "list", "key", "text", "number", "string", "object", "array"]


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character table, in byte order: printable bytes stand for themselves,
    the others for characters from U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def pool() -> list[str]:
    """The multi-character strings, in the order they take ids."""
    words = WORDS + [w.capitalize() for w in WORDS]
    numbers = [str(n) for n in range(10, 1000)]
    out = PUNCTUATION + words + [" " + w for w in words] + numbers + [" " + str(n) for n in range(1000)]
    out += [f'"{w}"' for w in WORDS] + [f'{{"{w}":' for w in WORDS] + [f' "{w}"' for w in WORDS]
    return out


def vocabulary(size: int = VOCAB_SIZE) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(token -> id, merges) of the recipe, its first `size` ids."""
    table = byte_chars()
    encode = {b: c for b, c in enumerate(table)}
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for c in table:
        vocab[c] = len(vocab)
    merges: list[tuple[str, str]] = []
    for text in pool():
        chars = "".join(encode[b] for b in text.encode("utf-8"))
        for end in range(2, len(chars) + 1):
            piece = chars[:end]
            if piece in vocab:
                continue
            if len(vocab) == size:
                return vocab, merges
            vocab[piece] = len(vocab)
            merges.append((chars[:end - 1], chars[end - 1]))
    raise AssertionError(f"the pool fills {len(vocab)} of {VOCAB_SIZE} ids")


def build(reasoning: bool = False):
    """The tokenizer (a `tokenizers.Tokenizer`) of the recipe, or of its reasoning variant."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = vocabulary(VOCAB_SIZE - len(THINK) if reasoning else VOCAB_SIZE)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in SPECIALS])
    if reasoning:  # ids 2046 and 2047: the next ids after the model's vocabulary
        tokenizer.add_tokens([AddedToken(tok, special=False, normalized=False) for tok in THINK])
    return tokenizer


def files(reasoning: bool = False) -> dict[str, str]:
    """File name -> its text, exactly as committed."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[1], "eos_token": SPECIALS[2],
              "pad_token": SPECIALS[0], "model_max_length": 16384, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": build(reasoning).to_str(pretty=True) + "\n",
            "tokenizer_config.json": json.dumps(config, indent=2, sort_keys=True) + "\n"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", metavar="DIR", help="write the tokenizer files into DIR")
    group.add_argument("--check", metavar="DIR", help="exit 1 unless DIR holds exactly what the recipe makes")
    parser.add_argument("--reasoning", action="store_true", help="the reasoning variant (<think> </think>)")
    args = parser.parse_args(argv)
    made = files(args.reasoning)
    if args.write:
        folder = Path(args.write)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in made.items():
            (folder / name).write_text(text, encoding="utf-8", newline="\n")
        return 0
    folder = Path(args.check)
    differ = [name for name, text in made.items()
              if not (folder / name).is_file() or (folder / name).read_text(encoding="utf-8") != text]
    if differ:
        print(f"{folder}: {', '.join(differ)} differ from the recipe; rerun with --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
