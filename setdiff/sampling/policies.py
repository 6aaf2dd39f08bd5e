"""Decoding policies: which tokens each forward commits and queries, and which it accepts. One per
paradigm; the engine (`setdiff.sampling.engine`) is shared. A policy is a frozen record of its
options with ``plan(state) -> Plan | None`` (None = done), ``rows_at_once(...)`` (a greedy
choice: the logits rows whose greedy tokens and confidences it reads from the forward's greedy
table) or else ``select(...)`` (a sampled choice, as tensors on the logits' device, nothing read
back), and ``apply(...)`` (the choices, read as lists, applied to the state). User options
(`DecodeOptions`) are parsed once, by ``from_options``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypedDict

import torch

from setdiff.arguments import is_int, is_number
from setdiff.config import ConfigError, check, frozen
from setdiff.masks import make_prompt_causal_mask_mod
from setdiff.sampling import verify as lossless
from setdiff.sampling.logits import accept_confident, choose_tokens
from setdiff.sampling.state import DecodeState, Plan

if TYPE_CHECKING:
    from setdiff.paradigm import Paradigm

Picks = tuple[torch.Tensor, ...]
"""A forward's choices on the device (`select`); `apply` gets each as a list of ints."""


class Drafter(Protocol):
    """A draft model (`setdiff.sampling.draft_model.DraftModel`)."""

    def propose(self, prefix: list[int], n: int) -> list[int]:
        """(n,) draft tokens after `prefix`, the verified tokens of positions 0.."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeContext:
    mask_id: int
    generator: torch.Generator
    n_new: int
    drafter: Drafter | None = None
    """Speculative AR decoding (``ARPolicy(draft_tokens=k)``): the draft model."""


class DecodeOptions(TypedDict, total=False):
    """Decode options as users give them; each policy takes the ones it declares (see there)."""

    window: int | Literal["all"] | None
    threshold: float | Literal["off"] | None
    temperature: float
    final_temperature: float | None
    top_p: float
    order: Literal["random", "confidence"]
    chunk_size: int
    verify: bool
    draft_tokens: int


_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "temperature": (lambda v: is_number(v) and v >= 0, "a finite number >= 0"),
    "final_temperature": (
        lambda v: v is None or (is_number(v) and v >= 0),
        "a finite number >= 0 or None",
    ),
    "top_p": (lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]"),
    "threshold": (
        lambda v: v is None or (isinstance(v, float) and 0 < v <= 1),
        "a float in (0, 1] or None",  # "off" is None once `parse_threshold` has read it
    ),
    "order": (lambda v: v in ("random", "confidence"), "random|confidence"),
    "chunk_size": (lambda v: is_int(v) and v >= 1, "an int >= 1"),
    "draft_tokens": (lambda v: is_int(v) and v >= 0, "an int >= 0"),
    "verify": (lambda v: isinstance(v, bool), "true or false"),
}
"""Each decode option's rule and how its error names it, checked for every policy holding it."""


def parse_threshold(threshold: float | str | None) -> float | None:
    """A user's threshold: None or "off" = no threshold; otherwise a confidence in (0, 1]."""
    if threshold is None or threshold == "off":
        return None
    if not (is_number(threshold) and 0 < threshold <= 1):
        raise ValueError(f"threshold must be in (0, 1] or 'off', got {threshold!r}")
    return float(threshold)


def _causal_plan(state: DecodeState, commit: list[int], queries: list[int]) -> Plan:
    return Plan(commit, list(range(state.next_group, state.next_group + len(commit))), queries)


def _window(state: DecodeState, window: int | None) -> list[int]:
    """The masked positions within `window` of the frontier (None: every masked position)."""
    front = state.frontier()
    return state.masked_from(front, state.gen_end if window is None else front + window)


def _lossless_rows(
    states: list[DecodeState], plans: list[Plan], spans: list[tuple[int, int]]
) -> list[list[int]]:
    """Each row's `setdiff.sampling.verify.rows`, in its span."""
    return [
        [start + r for r in lossless.rows(state, plan)]
        for state, plan, (start, _) in zip(states, plans, spans, strict=True)
    ]


class _Options:
    """Mixin: what every policy shares.

    - `from_options`: a policy from a dict of user options, naming unknown ones; every option
      is checked against its rule in `_RULES` (`check` adds a policy's rules across options).
    - How a policy uses a KV cache: `uses_cache` (False = every forward sees the whole canvas,
      as in MDLM), `max_forward(n_given, n_new)`, the most inputs one forward can feed (a
      too-small cache is refused before any compute): the first forward's prefill and its
      `first_queries`, or `max_step(n_new)`, the most inputs of a forward after the first (the
      shape a static compiled step pads to, `setdiff.sampling.static`).
    - The usual choice: a token for each of the plan's `candidates` (query positions), greedy
      (`rows_at_once`: their rows of the greedy table) or sampled (`select`), and `apply`
      accepts the most confident plus every one with confidence >= the policy's threshold
      (`accept_confident`).
    """

    uses_cache: bool = True
    speculative: bool = False
    """Drafts checked against the greedy decode (set as a property by the policies that can):
    exactly that decode, if its cache drops nothing (`setdiff.sampling.verify`)."""
    shift: bool = False
    """Shifted queries (fixed by the trained model): the query of position p is fed at p - 1
    with the token there (see `setdiff.sampling.inputs`)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            rule, what = _RULES.get(field.name, (None, ""))
            if rule is not None and not rule(value := getattr(self, field.name)):
                raise ValueError(f"{field.name} must be {what}, got {value!r}")
        self.check()

    def check(self) -> None:
        """A policy's rules across its options (each option's own rule is in `_RULES`)."""

    def max_forward(self, n_given: int, n_new: int) -> int:
        return max(n_given + self.first_queries(n_new), self.max_step(n_new))

    def max_step(self, n_new: int) -> int:
        """The most inputs of a forward after the first (0: no cache, so no static step)."""
        return 0

    def first_queries(self, n_new: int) -> int:
        """The queries of the first forward, fused with the prefill of the `n_given` tokens."""
        return 0

    @classmethod
    def from_options(cls, options: DecodeOptions | dict[str, Any], **fixed: Any) -> Any:
        """The policy for user `options` (parsed here: threshold "off" -> None) and the
        `fixed` values of the trained model (e.g. ``block_size``, ``shift``)."""
        known = {f.name for f in dataclasses.fields(cls)} - set(fixed)  # type: ignore[arg-type]
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"unknown decode option(s) {unknown} for {cls.__name__}; known: {sorted(known)}"
            )
        parsed = dict(options)
        if "threshold" in parsed:
            parsed["threshold"] = parse_threshold(parsed["threshold"])
        return cls(**parsed, **fixed)

    def choose(
        self, logits_MV: torch.Tensor, ctx: DecodeContext, temperature: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`choose_tokens` with the policy's sampling options (`temperature`: an annealed one)."""
        return choose_tokens(
            logits_MV,
            mask_id=ctx.mask_id,
            temperature=self.temperature if temperature is None else temperature,  # type: ignore[attr-defined]
            top_p=self.top_p,  # type: ignore[attr-defined]
            generator=ctx.generator,
        )

    def candidates(self, state: DecodeState, plan: Plan) -> list[int]:
        """The query positions this forward may decode (default: every query)."""
        return plan.queries

    def select(
        self, state: DecodeState, plan: Plan, logits: torch.Tensor, ctx: DecodeContext
    ) -> Picks:
        """The tokens and confidences of the `candidates`, from their queries' rows (the last
        ``len(plan.queries)`` rows of `logits`)."""
        m, chosen = len(plan.queries), self.candidates(state, plan)
        if not chosen:
            return ()
        rows = logits[-m:]
        if len(chosen) < m:
            row_of = {q: i for i, q in enumerate(plan.queries)}
            at = torch.tensor([row_of[p] for p in chosen], dtype=torch.long, device=logits.device)
            rows = rows.index_select(0, at)
        return self.choose(rows, ctx, self.step_temperature(plan, ctx))

    def step_temperature(self, plan: Plan, ctx: DecodeContext) -> float | None:
        """This forward's sampling temperature (None: the policy's `temperature`)."""
        return None

    def rows_at_once(
        self, states: list[DecodeState], plans: list[Plan], spans: list[tuple[int, int]]
    ) -> list[list[int]]:
        """Per row, the logits rows (in `spans`) whose greedy tokens and confidences are its picks
        (the engine reads them from the forward's greedy table, every row at once): those of
        its `candidates`; [] = not a greedy choice: each row's `select` chooses."""
        if not self.greedy:
            return []
        out = []
        for state, plan, (_, end) in zip(states, plans, spans, strict=True):
            first, chosen = end - len(plan.queries), self.candidates(state, plan)
            if chosen is plan.queries:
                out.append(list(range(first, end)))
            else:
                row_of = {q: first + i for i, q in enumerate(plan.queries)}
                out.append([row_of[p] for p in chosen])
        return out

    @property
    def greedy(self) -> bool:
        """Whether every choice is the greedy one (read from the greedy table)."""
        return self.temperature == 0  # type: ignore[attr-defined]

    def apply(
        self, state: DecodeState, plan: Plan, picks: list[list[int]], ctx: DecodeContext
    ) -> tuple[list[int], int]:
        """Apply one forward's `picks` (``select``'s tensors, read as lists) to `state` (its
        commit already recorded): the positions it decoded, and how many of its commits were
        rejected, to drop from the end of the cache (only the speculative rules reject any)."""
        if not picks:
            return [], 0
        tokens, confidence = picks
        keep = accept_confident(confidence, getattr(self, "threshold", None))
        chosen = self.candidates(state, plan)
        positions = [q for q, k in zip(chosen, keep, strict=True) if k]
        state.accept(positions, [t for t, k in zip(tokens, keep, strict=True) if k])
        return positions, 0


@frozen
class ARPolicy(_Options):
    """ar: next-token decoding; ``draft_tokens=k`` checks a draft model's k tokens a forward."""

    temperature: float = 0.0
    top_p: float = 1.0
    draft_tokens: int = 0
    """k: speculative decoding, the tokens a draft model (``generate(..., draft=model)``)
    proposes per forward; each forward checks them, so the output is exactly the greedy decode.
    0 = off."""

    def check(self) -> None:
        if self.draft_tokens:
            check(
                self.temperature == 0,
                "speculative decoding (draft_tokens) is greedy: temperature must be 0, "
                f"got {self.temperature}",
            )

    @property
    def speculative(self) -> bool:  # type: ignore[override]
        return self.draft_tokens > 0

    def max_step(self, n_new: int) -> int:
        return 1 + min(self.draft_tokens, n_new)  # the last verified token, then the drafts

    def plan(self, state: DecodeState) -> Plan | None:
        if not (state.has_masks or state.drafts):  # drafts are still to be checked
            return None
        commit = state.uncommitted_decoded()
        check(len(commit) > 0, "ar decoding needs a non-empty prompt")
        return _causal_plan(state, commit, [])

    def select(
        self, state: DecodeState, plan: Plan, logits: torch.Tensor, ctx: DecodeContext
    ) -> Picks:
        """A sampled choice (greedy ones, drafts included, are read from the greedy table)."""
        tokens, _ = self.choose(logits[-1:], ctx)
        return (tokens,)

    def rows_at_once(
        self, states: list[DecodeState], plans: list[Plan], spans: list[tuple[int, int]]
    ) -> list[list[int]]:
        if self.draft_tokens:
            return _lossless_rows(states, plans, spans)
        return [[end - 1] for _, end in spans] if self.greedy else []

    def apply(
        self, state: DecodeState, plan: Plan, picks: list[list[int]], ctx: DecodeContext
    ) -> tuple[list[int], int]:
        if not self.draft_tokens:
            position = state.frontier()
            state.accept([position], picks[0])
            return [position], 0
        drafter = ctx.drafter
        if drafter is None:
            raise ValueError("draft_tokens needs a draft model: generate(..., draft=model)")

        def propose(state: DecodeState) -> list[int]:
            end = state.verified_end()
            return drafter.propose(state.canvas[:end], min(self.draft_tokens, state.gen_end - end))

        return lossless.apply(state, plan, picks, ctx.mask_id, propose)


@frozen
class SetPolicy(_Options):
    """setdlm: a sliding window of W masked positions from the leftmost undecoded one."""

    window: int | Literal["all"] = 4
    """W: masked positions predicted per step, from the leftmost undecoded one ("all" = any)."""
    threshold: float | None = None
    """tau: also accept every window token with confidence >= tau; None = one per step."""
    temperature: float = 0.0
    top_p: float = 1.0
    max_window: int = 8
    """s_max of the trained schedule: windows wider than this were never trained (fixed)."""
    shift: bool = False
    verify: bool = False
    """Self-speculative decoding: the window's predictions are drafts that the next forward
    checks against the model's own left-to-right greedy predictions (`setdiff.sampling.verify`);
    the output is exactly the W = 1 greedy decode, in fewer forwards when drafts agree. Greedy,
    without threshold, and only with shifted queries."""

    def check(self) -> None:
        if self.verify:
            check(self.shift, "verify needs shifted queries (a model trained with shift: true)")
            check(
                self.temperature == 0,
                f"verify decodes greedily: temperature must be 0, got {self.temperature}",
            )
            check(
                self.threshold is None,
                f"verify accepts drafts by agreement: threshold must be off, got {self.threshold}",
            )
        if self.window != "all":
            check(
                is_int(self.window) and self.window >= 1,
                f"window must be an int >= 1 or 'all', got {self.window!r}",
            )
            check(
                self.window <= self.max_window,
                f"window W={self.window} exceeds the trained order window s_max="
                f"{self.max_window} (use W <= 2D, or window='all' for any-order decoding)",
            )

    @property
    def speculative(self) -> bool:  # type: ignore[override]
        return self.verify

    def first_queries(self, n_new: int) -> int:
        return n_new if self.window == "all" else min(self.window, n_new)

    def max_step(self, n_new: int) -> int:
        return 2 * self.first_queries(n_new)

    def plan(self, state: DecodeState) -> Plan | None:
        if not (state.has_masks or state.drafts):  # drafts are still to be checked
            return None
        # The first forward fuses the prefill (every given token, causal in position order)
        # with the first window's queries, as AR's first forward predicts its first token.
        window = None if self.window == "all" else self.window
        return _causal_plan(state, state.uncommitted_decoded(), _window(state, window))

    def rows_at_once(
        self, states: list[DecodeState], plans: list[Plan], spans: list[tuple[int, int]]
    ) -> list[list[int]]:
        if self.verify:
            return _lossless_rows(states, plans, spans)
        return _Options.rows_at_once(self, states, plans, spans)

    def apply(
        self, state: DecodeState, plan: Plan, picks: list[list[int]], ctx: DecodeContext
    ) -> tuple[list[int], int]:
        if self.verify:
            return lossless.apply(state, plan, picks, ctx.mask_id)
        return _Options.apply(self, state, plan, picks, ctx)


@frozen
class AnyOrderPolicy(_Options):
    """aogpt: one token a forward, in random or confidence order, temperature annealed."""

    order: Literal["random", "confidence"] = "random"
    temperature: float = 0.0
    final_temperature: float | None = None
    """Anneal the temperature linearly to this value over the generation (None = constant)."""
    top_p: float = 1.0
    window: int | None = None
    """Choose among the `window` masked positions from the leftmost undecoded one (a frontier);
    None = the whole canvas."""
    shift: bool = False

    def check(self) -> None:
        check(
            self.window is None or (is_int(self.window) and self.window >= 1),
            f"window must be an int >= 1 or None, got {self.window!r}",
        )

    def first_queries(self, n_new: int) -> int:
        return n_new if self.window is None else min(self.window, n_new)

    def max_step(self, n_new: int) -> int:
        return 1 + self.first_queries(n_new)

    def plan(self, state: DecodeState) -> Plan | None:
        if not state.has_masks:
            return None
        commit = state.uncommitted_decoded()  # the first forward: prefill fused with queries
        return _causal_plan(state, commit, _window(state, self.window))

    @property
    def greedy(self) -> bool:  # type: ignore[override]
        return self.order == "confidence" and self.temperature == 0 and not self.final_temperature

    def step_temperature(self, plan: Plan, ctx: DecodeContext) -> float:
        """Annealed linearly: ``n_new - m`` of `n_new` taken as decoded, for m queries."""
        if self.final_temperature is None:
            return self.temperature
        frac = (ctx.n_new - len(plan.queries)) / max(ctx.n_new - 1, 1)
        return self.temperature + (self.final_temperature - self.temperature) * frac

    def select(
        self, state: DecodeState, plan: Plan, logits: torch.Tensor, ctx: DecodeContext
    ) -> Picks:
        """Order "confidence": the usual choice, one accepted (the most confident). Order
        "random": the position is drawn first, then its token: picks (index, token)."""
        m = len(plan.queries)
        if self.order == "confidence" or m == 0:
            return _Options.select(self, state, plan, logits, ctx)
        g = ctx.generator
        i = torch.randint(m, (1,), generator=g, device=g.device).to(logits.device)
        return i, self.choose(
            logits[-m:].index_select(0, i), ctx, self.step_temperature(plan, ctx)
        )[0]

    def apply(
        self, state: DecodeState, plan: Plan, picks: list[list[int]], ctx: DecodeContext
    ) -> tuple[list[int], int]:
        if self.order == "confidence" or not picks:
            return _Options.apply(self, state, plan, picks, ctx)
        (i,), tokens = picks
        state.accept([plan.queries[i]], tokens)
        return [plan.queries[i]], 0


@frozen
class BlockPolicy(_Options):
    """bd3lm: blocks of S in order, queries see their whole block; the finished block is committed
    by the first forward of the next."""

    block_size: int = 4
    """S, fixed by the trained model."""
    threshold: float | None = None
    """tau: also accept every masked query with confidence >= tau; None = one per step."""
    temperature: float = 0.0
    top_p: float = 1.0
    shift: bool = False

    def first_queries(self, n_new: int) -> int:
        return self.block_size

    def max_step(self, n_new: int) -> int:
        return 2 * self.block_size

    def plan(self, state: DecodeState) -> Plan | None:
        if not state.has_masks:
            return None
        S = self.block_size
        start = state.frontier() // S * S
        commit = state.uncommitted_decoded(below=start)
        # Finished blocks (in the first forward, the prompt's full ones): bidirectional within,
        # causal across, committed with the queries of the block after them.
        queries = list(range(start, min(start + S, len(state.canvas))))
        return Plan(commit, [p // S for p in commit], queries, "all")

    def candidates(self, state: DecodeState, plan: Plan) -> list[int]:
        """The block's masked positions."""
        return [q for q in plan.queries if state.masked[q]]


@frozen
class MDLMPolicy(_Options):
    """mdlm: no cache, every forward sees the whole canvas; semi-autoregressive chunks."""

    uses_cache = False  # every forward sees the whole canvas bidirectionally

    chunk_size: int = 32
    """Semi-autoregressive chunk: positions unmasked chunk by chunk, left to right."""
    order: Literal["confidence", "random"] = "confidence"
    threshold: float | None = None
    """tau: also accept every masked query with confidence >= tau; None = one per step."""
    temperature: float = 0.0
    top_p: float = 1.0
    shift: bool = False
    """Dream's shift (fixed by the trained model): the output at p - 1 predicts p, so the
    queries are positions 1.. of the canvas."""
    causal_prompt: bool = False
    """Fixed by the trained model (`MDLMConfig.causal_prompt`): the prompt attends causally,
    the slots after it bidirectionally."""

    def first_queries(self, n_new: int) -> int:
        return n_new  # every forward: the whole canvas

    def plan(self, state: DecodeState) -> Plan | None:
        if not state.has_masks:
            return None
        queries = list(range(int(self.shift), len(state.canvas)))
        if not self.causal_prompt:
            return Plan([], [], queries, "all")
        # The rule of training, over the positions the queries are fed at.
        fed = torch.tensor(queries) - int(self.shift)
        rule = make_prompt_causal_mask_mod(torch.tensor([state.gen_start]))
        return Plan([], [], queries, rule(torch.zeros((), dtype=torch.long), 0, fed[:, None], fed))

    @property
    def greedy(self) -> bool:  # type: ignore[override]
        return self.order == "confidence" and self.temperature == 0

    def candidates(self, state: DecodeState, plan: Plan) -> list[int]:
        """The masked positions up to the end of the frontier's chunk."""
        chunk = (state.frontier() - state.gen_start) // self.chunk_size
        return state.masked_from(state.gen_start, state.gen_start + (chunk + 1) * self.chunk_size)

    def select(
        self, state: DecodeState, plan: Plan, logits: torch.Tensor, ctx: DecodeContext
    ) -> Picks:
        """The usual choice; order "random" then accepts one candidate drawn at random (its
        confidence set to inf)."""
        tokens, confidence = _Options.select(self, state, plan, logits, ctx)
        if self.order == "random":
            g = ctx.generator
            pick = torch.randint(len(tokens), (1,), generator=g, device=g.device)
            confidence = confidence.index_fill(0, pick.to(confidence.device), float("inf"))
        return tokens, confidence


DecodePolicy = ARPolicy | SetPolicy | AnyOrderPolicy | BlockPolicy | MDLMPolicy

POLICIES: dict[str, type[DecodePolicy]] = {
    "ar": ARPolicy,
    "mdlm": MDLMPolicy,
    "bd3lm": BlockPolicy,
    "aogpt": AnyOrderPolicy,
    "setdlm": SetPolicy,
}
"""Each paradigm's sampler, by the paradigm's name."""


def decode_policy(paradigm: Paradigm, options: DecodeOptions | dict[str, Any]) -> DecodePolicy:
    """`paradigm`'s sampler with the user's decode `options` and the values its trained model
    fixes (``paradigm.decode_fixed()``, e.g. ``shift``).

    Raises:
        ValueError: on an unknown option or a bad value, naming it.
    """
    policy: DecodePolicy = POLICIES[paradigm.config.name].from_options(
        options, **paradigm.decode_fixed()
    )
    return policy


def check_decode(paradigm: Paradigm, options: Mapping[str, Any], where: str) -> None:
    """Refuse decode `options` that build no policy of `paradigm`: a `ConfigError` naming
    `where` (the params file and key, e.g. ``params.yaml: decode.setdlm``)."""
    try:
        decode_policy(paradigm, dict(options))
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
