"""Tokenizers (character-level or byte-level BPE) and fixed-length encoding of task splits.

A tokenizer is a Hugging Face ``tokenizers`` model saved as one ``tokenizer.json``. The ones
trained here put the special tokens first: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<mask>``=3
(the character tokenizer adds ``<unk>``=4). A pretrained tokenizer (``kind: pretrained``, see
`setdiff.hf.load_pretrained_tokenizer`) keeps its own ids and names its four roles in a
``special_tokens_map.json`` beside ``tokenizer.json`` (the Hugging Face file of that name).
Either loads with ``transformers.PreTrainedTokenizerFast`` (see `load_hf_tokenizer`).

`encode_examples` lays a split out as an (N, L) int32 array: prompt/target tasks as
``<bos> prompt target <eos> <pad>...``, text tasks as ``<bos>`` + L-1 tokens of one long stream.
Nothing here reads params or writes files except `Tokenizer.save`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers

from setdiff.config import check, frozen
from setdiff.tasks import TASK_LAYOUTS, Record, check_task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<mask>")
"""Special tokens, in id order: they are always ids 0..3."""
UNK_TOKEN = "<unk>"
"""The character tokenizer's unknown token (id 4); byte-level BPE needs none."""
MIN_BPE_VOCAB = len(SPECIAL_TOKENS) + 256
"""Specials plus the 256-byte base alphabet of byte-level BPE."""


ROLES: tuple[str, ...] = ("pad_token", "bos_token", "eos_token", "mask_token")
"""The special roles this project relies on, named as in Hugging Face's special_tokens_map."""
DEFAULT_SPECIAL: dict[str, str] = dict(zip(ROLES, SPECIAL_TOKENS, strict=True))
"""Role -> token of the tokenizers trained here."""
SPECIAL_MAP_FILE = "special_tokens_map.json"
"""Beside ``tokenizer.json``: role -> token, for tokenizers whose specials are not ours."""


@frozen
class TokenizerConfig:
    """How one task's tokenizer is made and how long its encoded examples are."""

    kind: Literal["char", "bpe", "pretrained"]
    """``char``: one token per character of the training text; ``bpe``: byte-level BPE;
    ``pretrained``: a Hugging Face tokenizer used as is (e.g. the one of a pretrained model)."""
    vocab_size: int = 0
    """Target vocabulary size including specials (``bpe`` only, >= 260; leave 0 otherwise)."""
    seq_len: int
    """Fixed length L of every encoded example (row), including ``<bos>`` and ``<eos>``."""
    source: str = ""
    """``pretrained`` only: a local directory with ``tokenizer.json`` (and usually
    ``tokenizer_config.json``), or a hub id ``owner/name`` fetched when online."""
    bos_token: str | None = None
    """``pretrained`` only: the token starting every row; None = the tokenizer's own BOS, or its
    EOS when it has none (Qwen3)."""
    eos_token: str | None = None
    """``pretrained`` only: None = the tokenizer's own EOS."""
    pad_token: str | None = None
    """``pretrained`` only: None = the tokenizer's own PAD, else its EOS."""
    mask_token: str | None = None
    """``pretrained`` only: the existing token reused as [MASK]; None = the tokenizer's own
    mask token, else the first of `setdiff.hf.PREFERRED_MASK_TOKENS` it has."""

    def __post_init__(self) -> None:
        if self.kind == "bpe":
            check(
                self.vocab_size >= MIN_BPE_VOCAB,
                f"vocab_size must be >= {MIN_BPE_VOCAB} for bpe, got {self.vocab_size}",
            )
        else:
            check(self.vocab_size == 0, f"vocab_size applies to bpe only, not {self.kind}")
        pretrained_only = {
            "source": self.source,
            **{role: getattr(self, role) for role in ROLES},
        }
        if self.kind == "pretrained":
            check(bool(self.source), "source is required for kind pretrained")
        else:
            given = [key for key, value in pretrained_only.items() if value]
            check(not given, f"{given} apply to kind pretrained only")
        check(self.seq_len >= 3, f"seq_len must be >= 3, got {self.seq_len}")

    def special_overrides(self) -> dict[str, str]:
        """The roles this config sets explicitly (``pretrained`` only)."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role)}


# ---------------------------------------------------------------------------------------------
# training


def _special(token: str) -> AddedToken:
    return AddedToken(token, special=True, normalized=False)


def _train_char(texts: Iterable[str], config: TokenizerConfig) -> tokenizers.Tokenizer:
    alphabet = sorted(set().union(*(set(text) for text in texts)))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, UNK_TOKEN, *alphabet])}
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # Every character (newlines included) is its own pre-token; Fuse joins them back verbatim.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([_special(t) for t in (*SPECIAL_TOKENS, UNK_TOKEN)])
    return tokenizer


def _train_bpe(texts: Iterable[str], config: TokenizerConfig) -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(models.BPE())
    # Digits first, so no merge ever spans two digits; then GPT-2 style byte-level splitting.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=[_special(t) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


TOKENIZER_TRAINERS: dict[str, Callable[[Iterable[str], TokenizerConfig], tokenizers.Tokenizer]] = {
    "char": _train_char,
    "bpe": _train_bpe,
}
"""Tokenizer kind -> trainer."""


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig) -> tokenizers.Tokenizer:
    """Train a tokenizer of `config.kind` on `texts`; the same input gives the same JSON bytes.

    Raises:
        ValueError: if the trained tokenizer does not put the special tokens at ids 0..3, or
            `config.kind` is not trainable (``pretrained``).
    """
    if config.kind not in TOKENIZER_TRAINERS:
        raise ValueError(f"kind {config.kind!r} is not trained; see setdiff.hf for pretrained")
    tokenizer = TOKENIZER_TRAINERS[config.kind](list(texts), config)
    _check_special_ids(tokenizer)
    logger.info("trained %s tokenizer: %d tokens", config.kind, tokenizer.get_vocab_size())
    return tokenizer


def _check_special_ids(tokenizer: tokenizers.Tokenizer) -> None:
    ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    if ids != list(range(len(SPECIAL_TOKENS))):
        raise ValueError(f"special tokens {SPECIAL_TOKENS} must be ids 0..3, got {ids}")


def training_texts(records: Iterable[Record], task: str) -> Iterator[str]:
    """The strings a task's tokenizer is trained on: prompts and targets, or verse lines."""
    check_task(task)
    for record in records:
        if TASK_LAYOUTS[task] == "pairs":
            yield record["prompt"]
            yield record["target"]
        else:
            yield record["text"] + "\n"


# ---------------------------------------------------------------------------------------------
# the wrapper


class Tokenizer:
    """A tokenizer with the special ids this project relies on; no special tokens are added
    on encode, and all of them are skipped on decode.

    Args:
        special: role (`ROLES`) -> token; default `DEFAULT_SPECIAL`, which must be ids 0..3.
    Raises:
        ValueError: naming a role whose token is not in the vocabulary.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        path: Path | None = None,
        special: Mapping[str, str] | None = None,
    ) -> None:
        self.special = dict(special or DEFAULT_SPECIAL)
        if self.special == DEFAULT_SPECIAL:
            _check_special_ids(backend)
        missing = [role for role in ROLES if role not in self.special]
        if missing:
            raise ValueError(f"special tokens lack the role(s) {missing}")
        ids = {role: backend.token_to_id(self.special[role]) for role in ROLES}
        absent = {role: self.special[role] for role, i in ids.items() if i is None}
        if absent:
            raise ValueError(f"special token(s) {absent} are not in the vocabulary")
        self._ids: dict[str, int] = ids
        self.backend = backend
        self.path = path

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without special tokens."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` for many texts at once (parallel in the Rust backend)."""
        encodings = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, skipping special tokens."""
        return self.backend.decode(list(ids), skip_special_tokens=True)

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` to `path` and the special map beside it (not atomic; stages
        write `to_str()` and `special_map_str()` atomically)."""
        Path(path).write_text(self.to_str(), encoding="utf-8")
        Path(path).with_name(SPECIAL_MAP_FILE).write_text(self.special_map_str())

    def special_map_str(self) -> str:
        """The ``special_tokens_map.json`` text (role -> token)."""
        return json.dumps(self.special, indent=2, sort_keys=True) + "\n"

    def to_str(self) -> str:
        """The ``tokenizer.json`` text."""
        return self.backend.to_str()

    def id_of(self, role: str) -> int:
        """The id of a special role (`ROLES`)."""
        return self._ids[role]

    @property
    def pad_id(self) -> int:
        return self._ids["pad_token"]

    @property
    def bos_id(self) -> int:
        return self._ids["bos_token"]

    @property
    def eos_id(self) -> int:
        return self._ids["eos_token"]

    @property
    def mask_id(self) -> int:
        return self._ids["mask_token"]

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included (embedding rows needed)."""
        return self.backend.get_vocab_size(with_added_tokens=True)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a ``tokenizer.json``, with the special roles of a ``special_tokens_map.json`` beside
    it when there is one (pretrained tokenizers), else the default ones (ids 0..3)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file {path} does not exist (run the tokenize stage)")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust backend raises a bare Exception for any bad file
        raise ValueError(
            f"{path}: not a valid tokenizer.json ({' '.join(str(err).split())})"
        ) from None
    special = read_special_map(path)
    try:
        return Tokenizer(backend, path, special)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def read_special_map(tokenizer_path: str | Path) -> dict[str, str] | None:
    """The roles in the ``special_tokens_map.json`` beside `tokenizer_path`; None if absent.

    Raises:
        ValueError: if the file lacks one of `ROLES`.
    """
    path = Path(tokenizer_path).with_name(SPECIAL_MAP_FILE)
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of role -> token")
    special = declared_roles(raw)
    missing = [role for role in ROLES if role not in special]
    if missing:
        raise ValueError(f"{path}: no token for role(s) {missing}")
    return special


def declared_roles(raw: Mapping[str, Any]) -> dict[str, str]:
    """The `ROLES` a Hugging Face tokenizer file (special map or tokenizer config) declares.

    Values may be tokens or ``{"content": token, ...}`` records; empty or null ones are left
    out, and so are other keys (``unk_token``, ``additional_special_tokens``, ...).
    """
    found = {}
    for role in ROLES:
        value = raw.get(role)
        token = value.get("content") if isinstance(value, dict) else value
        if isinstance(token, str) and token:
            found[role] = token
    return found


def load_hf_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The same ``tokenizer.json`` as a ``transformers`` tokenizer with the special roles set."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = load_tokenizer(path)
    roles: dict[str, Any] = dict(tokenizer.special)
    if tokenizer.backend.token_to_id(UNK_TOKEN) is not None:
        roles["unk_token"] = UNK_TOKEN
    return PreTrainedTokenizerFast(
        tokenizer_file=str(path), clean_up_tokenization_spaces=False, **roles
    )


# ---------------------------------------------------------------------------------------------
# fixed-length encoding


@frozen
class EncodedSplit:
    """One split as fixed-length rows."""

    tokens: np.ndarray
    """(N, L) int32 token ids, right-padded with ``<pad>``."""
    context_len: np.ndarray
    """(N,) int32 number of leading context tokens (``<bos>`` + prompt); 1 for text."""
    length: np.ndarray
    """(N,) int32 number of non-pad tokens."""
    n_dropped: int
    """Examples that did not fit in L (for text: 1 if an incomplete last chunk was dropped)."""


def _encode_pairs(records: Sequence[Record], tokenizer: Tokenizer, seq_len: int) -> EncodedSplit:
    prompts = tokenizer.encode_batch([r["prompt"] for r in records])
    targets = tokenizer.encode_batch([r["target"] for r in records])
    rows, context_len = [], []
    for prompt, target in zip(prompts, targets, strict=True):
        row = [tokenizer.bos_id, *prompt, *target, tokenizer.eos_id]
        if len(row) <= seq_len:
            rows.append(row)
            context_len.append(1 + len(prompt))
    tokens = np.full((len(rows), seq_len), tokenizer.pad_id, dtype=np.int32)  # (N, L)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    return EncodedSplit(
        tokens=tokens,
        context_len=np.asarray(context_len, dtype=np.int32).reshape(-1),
        length=np.asarray([len(r) for r in rows], dtype=np.int32).reshape(-1),
        n_dropped=len(records) - len(rows),
    )


def _encode_stream(records: Sequence[Record], tokenizer: Tokenizer, seq_len: int) -> EncodedSplit:
    # Verse by verse with "\n" kept on all but the last: both tokenizers split at newlines, so
    # this equals encoding the joined text, in parallel and without one giant string.
    lines = [r["text"] + "\n" for r in records]
    if lines:
        lines[-1] = records[-1]["text"]
    stream = np.fromiter(
        (i for ids in tokenizer.encode_batch(lines) for i in ids), dtype=np.int32
    )  # (T,)
    body = seq_len - 1
    n_rows = len(stream) // body
    tokens = np.empty((n_rows, seq_len), dtype=np.int32)  # (N, L)
    tokens[:, 0] = tokenizer.bos_id
    tokens[:, 1:] = stream[: n_rows * body].reshape(n_rows, body)
    return EncodedSplit(
        tokens=tokens,
        context_len=np.ones(n_rows, dtype=np.int32),
        length=np.full(n_rows, seq_len, dtype=np.int32),
        n_dropped=int(len(stream) % body > 0),
    )


_ENCODERS: dict[str, Callable[[Sequence[Record], Tokenizer, int], EncodedSplit]] = {
    "pairs": _encode_pairs,
    "stream": _encode_stream,
}


def encode_examples(
    records: Sequence[Record], tokenizer: Tokenizer, seq_len: int, task: str
) -> EncodedSplit:
    """Encode one split of `task` into fixed-length rows of `seq_len` tokens.

    Prompt/target tasks: ``<bos> prompt target <eos>`` right-padded with ``<pad>``; an example
    longer than `seq_len` is dropped and counted. Text: the split's verse texts joined by
    ``"\\n"``, tokenized, and cut into rows of ``<bos>`` + (`seq_len` - 1) tokens; the last
    incomplete row is dropped.

    Returns:
        An `EncodedSplit` with tokens (N, L), context_len (N,), length (N,) and n_dropped.
    """
    check_task(task)
    return _ENCODERS[TASK_LAYOUTS[task]](records, tokenizer, seq_len)
