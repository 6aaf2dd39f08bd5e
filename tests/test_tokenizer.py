"""Tests for setdiff.tokenizer: specials, round trips, determinism, fixed-length layout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tokenizers
from transformers import PreTrainedTokenizerFast

from setdiff.config import ConfigError
from setdiff.params import Params
from setdiff.tasks.text import read_kjv
from setdiff.tokenizer import (
    SPECIAL_TOKENS,
    UNK_TOKEN,
    Tokenizer,
    TokenizerConfig,
    encode_examples,
    load_hf_tokenizer,
    load_tokenizer,
    train_tokenizer,
    training_texts,
)

CHAR = TokenizerConfig(kind="char", seq_len=16)
BPE = TokenizerConfig(kind="bpe", vocab_size=300, seq_len=32)
HELD_OUT = 'And Jonah said, 12 or 345 days; "Arise" (go) - it\'s 2024!\n  Next line.'


@pytest.fixture(scope="module")
def verses() -> list[dict[str, Any]]:
    return read_kjv()[:2000]


@pytest.fixture(scope="module")
def bpe(verses: list[dict[str, Any]]) -> Tokenizer:
    return Tokenizer(train_tokenizer(training_texts(verses, "text"), BPE))


@pytest.fixture(scope="module")
def char(verses: list[dict[str, Any]]) -> Tokenizer:
    texts = [*training_texts(verses, "text"), "0123456789+-=#"]
    return Tokenizer(train_tokenizer(texts, CHAR))


# ---------------------------------------------------------------------------------------------
# config


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"kind": "word", "seq_len": 8}, "tokenizer.arith.kind"),
        ({"kind": "bpe", "vocab_size": 100, "seq_len": 8}, "vocab_size"),
        ({"kind": "char", "vocab_size": 300, "seq_len": 8}, "vocab_size"),
        ({"kind": "char", "seq_len": 2}, "seq_len"),
        ({"kind": "char"}, "seq_len"),
        ({"kind": "char", "seq_len": 8, "seqlen": 8}, "seqlen"),
        ({"kind": "char", "seq_len": "8"}, "tokenizer.arith.seq_len"),
    ],
)
def test_tokenizer_config_errors_name_the_key(values: dict[str, Any], named: str) -> None:
    params = Params({"tokenizer": {"arith": values}}, Path("p.yaml"))
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        params.section("tokenizer.arith", TokenizerConfig)


# ---------------------------------------------------------------------------------------------
# special ids, round trips


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_special_ids(name: str, request: pytest.FixtureRequest) -> None:
    tokenizer: Tokenizer = request.getfixturevalue(name)
    assert [tokenizer.backend.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.mask_id) == (0, 1, 2, 3)
    assert tokenizer.vocab_size == tokenizer.backend.get_vocab_size(with_added_tokens=True)


def test_char_round_trip_and_unknowns(char: Tokenizer, verses: list[dict[str, Any]]) -> None:
    text = "\n".join(v["text"] for v in verses[:50]) + "\n12+345=357 #357"
    ids = char.encode(text)
    assert len(ids) == len(text) and 4 not in ids
    assert char.decode(ids) == text
    assert char.backend.token_to_id(UNK_TOKEN) == 4
    assert char.encode("a€b") == [char.encode("a")[0], 4, char.encode("b")[0]]
    assert char.decode([1, *char.encode("hi"), 2, 0, 0]) == "hi"


def test_bpe_round_trip_and_digits(bpe: Tokenizer) -> None:
    assert bpe.vocab_size == 300
    assert bpe.decode(bpe.encode(HELD_OUT)) == HELD_OUT
    assert bpe.decode(bpe.encode("naïve € ✓")) == "naïve € ✓"
    digits = bpe.encode("12345")
    assert [bpe.decode([i]) for i in digits] == list("12345")
    assert bpe.decode([1, *bpe.encode("the LORD"), 2, 3, 0]) == "the LORD"


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_saved_file_loads_in_transformers(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    tokenizer: Tokenizer = request.getfixturevalue(name)
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    text = "In the beginning God created the heaven and the earth.\n12 + 3 = 15"
    plain = PreTrainedTokenizerFast(tokenizer_file=str(path))
    ids = plain.encode(text, add_special_tokens=False)
    assert ids == tokenizer.encode(text)
    assert plain.decode(ids) == text
    assert plain.decode([1, *ids, 2, 0], skip_special_tokens=True) == text
    hf = load_hf_tokenizer(path)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id, hf.mask_token_id) == (0, 1, 2, 3)
    assert hf.decode([1, *ids, 2, 0], skip_special_tokens=True) == text
    loaded = load_tokenizer(path)
    assert loaded.path == path and loaded.encode(text) == ids


def test_wrong_special_ids_are_rejected() -> None:
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "<pad>": 1}, "a"))
    with pytest.raises(ValueError, match="ids 0..3"):
        Tokenizer(backend)


# ---------------------------------------------------------------------------------------------
# determinism

_TRAIN_SCRIPT = """
import sys
from setdiff.tasks.text import read_kjv
from setdiff.tokenizer import TokenizerConfig, train_tokenizer, training_texts
verses = read_kjv()[:2000]
config = TokenizerConfig(kind="bpe", vocab_size=300, seq_len=32)
sys.stdout.write(train_tokenizer(training_texts(verses, "text"), config).to_str())
"""


def test_bpe_is_deterministic_across_processes(bpe: Tokenizer, verses: list[dict]) -> None:
    again = train_tokenizer(training_texts(verses, "text"), BPE).to_str()
    assert again == bpe.to_str()
    # A fresh process has fresh hash seeds (Python and Rust); the bytes must not change.
    other = subprocess.run(
        [sys.executable, "-c", _TRAIN_SCRIPT], capture_output=True, text=True, check=True
    ).stdout
    assert other == bpe.to_str()


def test_char_is_deterministic(verses: list[dict[str, Any]]) -> None:
    texts = list(training_texts(verses[:100], "text"))
    first = train_tokenizer(texts, CHAR).to_str()
    assert train_tokenizer(reversed(texts), CHAR).to_str() == first


# ---------------------------------------------------------------------------------------------
# fixed-length encoding


def test_training_texts_per_layout() -> None:
    record = {"prompt": "1+2=", "target": "1+2=3 #3"}
    assert list(training_texts([record], "arith")) == ["1+2=", "1+2=3 #3"]
    assert list(training_texts([{"text": "Amen."}], "text")) == ["Amen.\n"]


def test_encode_pairs_layout_and_drops(char: Tokenizer) -> None:
    records = [
        {"prompt": "12+3=", "target": "12+3=15 #15"},  # 1 + 5 + 11 + 1 = 18 > 16: dropped
        {"prompt": "1+2=", "target": "1+2=3 #3"},  # 1 + 4 + 8 + 1 = 14
        {"prompt": "9-9=", "target": "9-9=0 #0"},
    ]
    split = encode_examples(records, char, 16, "arith")
    assert split.n_dropped == 1
    assert split.tokens.shape == (2, 16) and split.tokens.dtype == np.int32
    assert split.context_len.tolist() == [5, 5] and split.length.tolist() == [14, 14]
    row = split.tokens[0].tolist()
    assert row[0] == char.bos_id
    assert row[1:5] == char.encode("1+2=")
    assert row[5:13] == char.encode("1+2=3 #3")
    assert row[13] == char.eos_id and row[14:] == [char.pad_id] * 2
    assert char.decode(row) == "1+2=1+2=3 #3"
    assert split.context_len.dtype == split.length.dtype == np.int32


def test_encode_stream_layout(bpe: Tokenizer, verses: list[dict[str, Any]]) -> None:
    records = verses[:40]
    split = encode_examples(records, bpe, 32, "text")
    stream = bpe.encode("\n".join(r["text"] for r in records))
    n_rows = len(stream) // 31
    assert split.tokens.shape == (n_rows, 32)
    assert (split.tokens[:, 0] == bpe.bos_id).all()
    assert split.tokens[:, 1:].reshape(-1).tolist() == stream[: n_rows * 31]
    assert (split.context_len == 1).all() and (split.length == 32).all()
    assert split.n_dropped == int(len(stream) % 31 > 0)


def test_encode_empty_split(char: Tokenizer) -> None:
    assert encode_examples([], char, 16, "arith").tokens.shape == (0, 16)
    assert encode_examples([], char, 16, "text").tokens.shape == (0, 16)
