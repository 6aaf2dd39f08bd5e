"""The lm-eval model type ``setdiff``: any setdiff model directory behind lm-eval's `LM` API.

- `generate_until`: the paradigm's own sampler (`setdiff.generate`) with the decode options given
  as model args (``window``, ``threshold``, ``order``, ``chunk_size``, ...; validated before any
  compute). A request's ``generation_kwargs`` may override them (``do_sample: false`` means
  temperature 0); decoding stops at the model's EOS and at the request's ``until`` strings, and the
  text before the first stop string is returned. Batch 1, one request after another.
- `loglikelihood`: exact ``log p(continuation | BOS context)`` for ``ar`` (one causal forward);
  for the other paradigms the negative of their training bound (NELBO / order-sampled NLL, as the
  evaluate stage reports it) on the row ``BOS context continuation`` padded to the model's
  context: a lower bound on the log-likelihood, Monte Carlo over ``mc_samples`` draws.
  ``is_greedy`` is exact for ``ar`` and always False otherwise. `get_model_info` puts which one
  it is (``likelihood: exact | bound``) in the results' ``config``.
- `loglikelihood_rolling`: lm-eval's disjoint rolling windows of the model context, each scored
  as above given the tokens before it in its window (exact for ``ar``, a bound otherwise).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from setdiff.arguments import is_int
from setdiff.artifacts import load_model
from setdiff.masks import make_causal_mask_mod, training_mask
from setdiff.paradigm import Batch
from setdiff.sampling.loop import as_stop_strings, generate
from setdiff.sampling.policies import decode_policy

log = logging.getLogger(__name__)

ADAPTER_ARGS = ("path", "device", "seed", "mc_samples", "paradigm", "task", "tokenizer")
"""Model args the adapter reads itself; every other one is a decode option of the paradigm."""
IGNORED_ARGS = ("batch_size", "max_batch_size")
"""Passed by lm-eval to every model; decoding here is batch 1."""
GEN_KWARGS_OWN = ("until", "max_gen_toks", "do_sample")
"""Request generation kwargs handled here; the others are decode options."""


@register_model("setdiff")
class SetdiffLM(TemplateLM):
    """``--model setdiff --model_args path=<model dir>[,<decode option>=<value>...]``.

    Args:
        path: a model directory written by the train stage (``models/<task>/<paradigm>``).
        device: torch device (default CPU; a CUDA device falls back to the CPU without CUDA).
        seed: the sampler's seed for every request (as the evaluate stage), and the seed of the
            likelihood bound's noise.
        mc_samples: draws averaged for a non-AR likelihood bound.
        paradigm, task, tokenizer: what the directory must hold (`setdiff.load_model`).
        **decode_options: the paradigm's decode options (unknown ones are refused).
    Raises:
        ValueError: one line naming the argument or directory, before any compute.
    """

    def __init__(
        self,
        path: str | None = None,
        device: str | None = None,
        seed: int = 0,
        mc_samples: int = 1,
        paradigm: str | None = None,
        task: str | None = None,
        tokenizer: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if not path:
            raise ValueError("model_args: path=<setdiff model directory> is required")
        if not is_int(seed):
            raise ValueError(f"model_args: seed must be an integer, got {seed!r}")
        if not is_int(mc_samples) or mc_samples < 1:
            raise ValueError(f"model_args: mc_samples must be an integer >= 1, got {mc_samples!r}")
        decode = {k: v for k, v in options.items() if k not in IGNORED_ARGS}
        self.model = load_model(
            path, pick_device(device), paradigm=paradigm, task=task, tokenizer=tokenizer
        )
        if self.model.tokenizer is None:
            raise ValueError(f"path={path}: the model directory has no tokenizer.json")
        try:
            decode_policy(self.model.paradigm, decode)
        except ValueError as err:
            raise ValueError(f"model_args: {err}") from None
        self.tok = self.model.tokenizer
        self.name = self.model.paradigm.config.name
        self.decode_options, self.seed, self.mc_samples = decode, seed, mc_samples
        self._device = next(self.model.net.parameters()).device

    # -- lm-eval's token interface -------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tok.bos_id

    @property
    def max_length(self) -> int:
        return int(self.model.net.config.max_seq_len)

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        return self.tok.encode(string)

    def tok_decode(self, tokens: list[int], **_: Any) -> str:
        return self.tok.decode(tokens)

    def get_model_info(self) -> dict[str, Any]:
        return {
            "setdiff": {
                "path": str(self.model.path),
                "paradigm": self.name,
                "decode_options": self.decode_options,
                "seed": self.seed,
                "likelihood": "exact" if self.name == "ar" else "bound",
                "likelihood_note": (
                    "exact log p(continuation | context)"
                    if self.name == "ar"
                    else f"negative {self.name} training bound (NELBO / order-sampled NLL), "
                    f"{self.mc_samples} Monte Carlo draw(s): a lower bound on log p; "
                    "is_greedy is always False"
                ),
            }
        }

    # -- generation ----------------------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        plans = [
            self._plan(context, dict(kwargs)) for context, kwargs in (r.args for r in requests)
        ]
        out = []
        for prompt, n_new, until, options in plans:
            result = generate(
                self.model,
                prompt,
                max_new_tokens=n_new,
                stop_ids=[self.tok.eos_id],
                stop_strings=until,
                **{"seed": self.seed, **options},
            )
            out.append(cut_at_stop(self.tok.decode(result.tokens), until))
        return out

    def _plan(
        self, context: str, kwargs: dict[str, Any]
    ) -> tuple[list[int], int, list[str], dict[str, Any]]:
        """(prompt ids, new tokens, stop strings, decode options) of one request, validated."""
        until = kwargs.get("until") or []
        until = list(
            as_stop_strings(
                [until] if isinstance(until, str) else until, "generation_kwargs: until"
            )
        )
        options = dict(self.decode_options)
        options.update({k: v for k, v in kwargs.items() if k not in GEN_KWARGS_OWN})
        if kwargs.get("do_sample") is False:
            options["temperature"] = 0.0
        try:
            decode_policy(self.model.paradigm, options)
        except ValueError as err:
            raise ValueError(f"generation_kwargs: {err}") from None
        prompt = [self.tok.bos_id] + self.tok.encode(context)
        wanted = kwargs.get("max_gen_toks")
        room = self.max_length - len(prompt)
        if room < 1:
            keep = self.max_length - min(int(wanted or 1), self.max_length - 1) - 1
            log.warning("context of %d tokens left-truncated to %d", len(prompt) - 1, keep)
            prompt = [self.tok.bos_id] + prompt[len(prompt) - keep :]
            room = self.max_length - len(prompt)
        n_new = room if wanted is None else max(1, min(int(wanted), room))
        return prompt, n_new, until, options

    # -- likelihood ----------------------------------------------------------------------------

    def _loglikelihood_tokens(
        self, requests: list[Any], disable_tqdm: bool = False, **_: Any
    ) -> list[tuple[float, bool]]:
        out = []
        for _, context, continuation in requests:
            context = list(context)
            if context[:1] != [self.tok.bos_id]:
                context = [self.tok.bos_id] + context
            out.append(self.score(context, list(continuation)))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in (r.args for r in requests):
            windows = get_rolling_token_windows(
                self.tok_encode(string), self.tok.bos_id, self.max_length - 2, 1
            )  # windows of max_length - 1 tokens (the first one BOS), BOS prepended to the rest
            total = 0.0
            for context, target in map(make_disjoint_window, windows):
                if context[:1] != [self.tok.bos_id]:
                    context = [self.tok.bos_id] + context
                total += self.score(context, target)[0]
            out.append(total)
        return out

    @torch.no_grad()
    def score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """(log-likelihood or its bound, is_greedy) of `continuation` after `context`."""
        tokens = context + continuation
        if not continuation:
            return 0.0, True
        if len(tokens) > self.max_length:
            raise ValueError(
                f"context ({len(context)}) + continuation ({len(continuation)}) tokens exceed the "
                f"model context max_seq_len={self.max_length}"
            )
        if self.name == "ar":
            return self._ar_score(tokens, len(context))
        row = tokens + [self.tok.pad_id] * (self.max_length - len(tokens))
        batch = Batch(
            torch.tensor([row], device=self._device),
            torch.tensor([len(context)], device=self._device),
            torch.tensor([len(tokens)], device=self._device),
        )
        generator = torch.Generator().manual_seed(self.seed)
        draws = [
            float(self.model.paradigm.loss(self.model.net, batch, generator).nll_sum[0])
            for _ in range(self.mc_samples)
        ]
        return -sum(draws) / len(draws), False

    def _ar_score(self, tokens: list[int], n_context: int) -> tuple[float, bool]:
        ids = torch.tensor(tokens, device=self._device)
        n = len(tokens) - 1
        mask = training_mask("causal", make_causal_mask_mod(), n, device=self._device)
        logits = self.model.net(ids[None, :-1], torch.arange(n, device=self._device), mask)[0]
        logp = torch.log_softmax(logits.float(), -1)[n_context - 1 :]
        targets = ids[n_context:]
        total = float(logp.gather(1, targets[:, None]).sum())
        return total, bool((logp.argmax(-1) == targets).all())


def pick_device(device: str | None) -> str:
    """`device`, or the CPU when none is given or when it names CUDA on a machine without it
    (lm-eval's CLI passes ``cuda:0`` by default; its own HF model falls back the same way)."""
    if not device:
        return "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"device: not a torch device: {device!r}") from None
    if kind == "cuda" and not torch.cuda.is_available():
        log.warning("device %s: CUDA is not available here; using the CPU", device)
        return "cpu"
    return device


def cut_at_stop(text: str, until: list[str]) -> str:
    """`text` before the first occurrence of any stop string (lm-eval's convention)."""
    for stop in until:
        if stop:
            text = text.split(stop, 1)[0]
    return text
