"""AR baseline through an OpenAI-compatible ``/v1/completions`` server (vLLM), greedy, batch 1.

`complete` sends one prompt, preferably as token ids (vLLM accepts a list of ints as
``prompt``), so the server sees exactly the tokens our decoder sees, and asks for token ids back:
vLLM's ``return_token_ids`` extension gives ``choices[0].token_ids``; failing that, with
``logprobs`` requested, ``return_tokens_as_token_ids`` spells each token ``"token_id:<id>"``.
Servers that give neither (plain OpenAI) return text only; `complete` then re-encodes the text
with the caller's tokenizer, which is NOT guaranteed to give the sampled ids (tokenization is not
unique) and is reported as ``token_source="tokenizer"``.

Every answer is validated as a whole before it is returned: a missing or ill-typed field, a
non-JSON body, or an unfinished choice is a `ServerError` (after bounded retries), never a partial
result. Connection errors, timeouts, 429 and 5xx are retried with exponential backoff; other 4xx
fail at once. Knows nothing of how the server was started (see `vllm_server`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol
from urllib.parse import urlparse

import openai

logger = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
TOKEN_ID_PREFIX = "token_id:"
FINISHED = ("stop", "length")
"""Finish reasons of a complete answer; anything else (None, "abort", ...) is an error."""

TokenSource = Literal["server", "logprobs", "tokenizer", "none"]


class ServerError(RuntimeError):
    """The server gave no usable answer (after the allowed retries, when retryable)."""


class _BadAnswer(Exception):
    """A 200 answer that is not a well-formed, finished completion (retryable)."""


class TextEncoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class CompletionResult:
    """One finished completion."""

    text: str
    """Generated text (special tokens skipped by the server)."""
    tokens: list[int] | None
    """Generated token ids, the stop token included when the server reports it; None = unknown."""
    token_source: TokenSource
    """Where `tokens` came from: the server's ids, logprob entries, our tokenizer, or nowhere."""
    finish_reason: str
    """``stop`` (EOS / stop string) or ``length`` (max_tokens reached)."""
    seconds: float
    """Wall time of the successful request (retries not included)."""
    prompt_tokens: int | None
    """Usage reported by the server."""
    completion_tokens: int | None
    logprobs: list[float] | None
    """Log-probability of each generated token, when requested."""
    attempts: int
    """Requests made, the successful one included."""


def make_client(base_url: str, *, timeout: float, api_key: str = "EMPTY") -> openai.OpenAI:
    """An OpenAI client with the library's own retries off (`complete` does them)."""
    # Loopback traffic must not go through an HTTP(S)_PROXY from the environment.
    http_client = openai.DefaultHttpxClient(trust_env=not is_loopback(base_url))
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key,
        timeout=timeout,
        max_retries=0,
        http_client=http_client,
    )


def is_loopback(base_url: str) -> bool:
    return urlparse(base_url).hostname in LOOPBACK_HOSTS


def complete(
    base_url: str,
    model: str,
    prompt: str | Sequence[int],
    max_tokens: int,
    *,
    eos_id: int | None = None,
    stop: Sequence[str] = (),
    suppress_ids: Sequence[int] = (),
    logprobs: int | None = None,
    tokenizer: TextEncoder | None = None,
    timeout: float = 60.0,
    retries: int = 3,
    backoff_s: float = 0.5,
    client: openai.OpenAI | None = None,
) -> CompletionResult:
    """Greedy (temperature 0) completion of one prompt.

    Args:
        base_url: the server's OpenAI root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name.
        prompt: token ids (preferred: no server-side tokenization) or text.
        max_tokens: the most tokens to generate.
        eos_id: stop after this token id; None = ignore EOS and always generate `max_tokens`
            (vLLM's ``ignore_eos``), like `hf_generate` with ``eos_id=None``.
        stop: stop strings.
        suppress_ids: token ids never to generate (logit bias -100), e.g. [MASK], which our
            AR decoder never emits.
        logprobs: also return the chosen tokens' log-probabilities (OpenAI ``logprobs``).
        tokenizer: re-encodes the text when the server returns no token ids.
        timeout: seconds per request (connect, read, write).
        retries: extra attempts after a retryable failure.
        backoff_s: first retry delay; doubled on each further retry (capped at 8 s).
        client: a client from `make_client` to reuse; by default one is made per call.
    Raises:
        ServerError: when no valid, finished answer came back within the attempts.
        ValueError: on bad arguments (before any request).
    """
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    request = _request(model, prompt, max_tokens, eos_id, stop, suppress_ids, logprobs)
    if client is not None:
        return _complete_with_retries(
            client, base_url, request, retries, backoff_s, timeout, tokenizer
        )
    with make_client(base_url, timeout=timeout) as own_client:
        return _complete_with_retries(
            own_client, base_url, request, retries, backoff_s, timeout, tokenizer
        )


def _complete_with_retries(
    client: openai.OpenAI,
    base_url: str,
    request: dict[str, Any],
    retries: int,
    backoff_s: float,
    timeout: float,
    tokenizer: TextEncoder | None,
) -> CompletionResult:
    logprobs = request.get("logprobs")
    attempts = retries + 1
    last_error = "no attempt made"
    for attempt in range(1, attempts + 1):
        try:
            tic = time.perf_counter()
            raw = client.completions.with_raw_response.create(**request, timeout=timeout)
            seconds = time.perf_counter() - tic
            return _result(raw.http_response.text, logprobs, tokenizer, seconds, attempt)
        except openai.APIStatusError as err:
            if err.status_code != 429 and err.status_code < 500:
                raise ServerError(
                    f"{base_url}: HTTP {err.status_code} (not retried): {_snippet(err.message)}"
                ) from err
            last_error = f"HTTP {err.status_code}: {_snippet(err.message)}"
        except openai.APITimeoutError:
            last_error = f"timed out after {timeout:g} s"
        except openai.APIConnectionError as err:
            last_error = f"connection failed: {err.__cause__ or err}"
        except _BadAnswer as err:
            last_error = f"malformed answer: {err}"
        logger.warning("%s: attempt %d/%d failed: %s", base_url, attempt, attempts, last_error)
        if attempt < attempts:
            time.sleep(min(backoff_s * 2 ** (attempt - 1), 8.0))
    raise ServerError(f"{base_url}: no valid completion after {attempts} attempt(s): {last_error}")


def _request(
    model: str,
    prompt: str | Sequence[int],
    max_tokens: int,
    eos_id: int | None,
    stop: Sequence[str],
    suppress_ids: Sequence[int],
    logprobs: int | None,
) -> dict[str, Any]:
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not isinstance(prompt, str):
        prompt = list(prompt)
        if not prompt or not all(_is_int(i) and i >= 0 for i in prompt):
            raise ValueError("prompt must be text or a non-empty list of token ids")
    # vLLM sampling extensions; other servers ignore unknown fields or reject them with a 400.
    extra: dict[str, Any] = {"return_token_ids": True}
    if eos_id is None:
        extra["ignore_eos"] = True
    else:
        extra["stop_token_ids"] = [eos_id]
    if logprobs is not None:
        extra["return_tokens_as_token_ids"] = True
    request: dict[str, Any] = dict(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, extra_body=extra
    )
    if stop:
        request["stop"] = list(stop)
    if suppress_ids:
        request["logit_bias"] = {str(i): -100 for i in suppress_ids}
    if logprobs is not None:
        request["logprobs"] = logprobs
    return request


def _result(
    body: str, logprobs: int | None, tokenizer: TextEncoder | None, seconds: float, attempt: int
) -> CompletionResult:
    """Validate a whole answer body; raise `_BadAnswer` on anything missing or ill-typed."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError:
        raise _BadAnswer(f"not JSON: {_snippet(body)}") from None
    choice = _first_choice(payload)
    text, finish_reason = choice.get("text"), choice.get("finish_reason")
    if not isinstance(text, str):
        raise _BadAnswer(f"choices[0].text is not a string: {text!r}")
    if finish_reason not in FINISHED:
        raise _BadAnswer(f"unfinished choice (finish_reason={finish_reason!r})")
    token_logprobs, logprob_ids = _logprobs(choice, logprobs)
    prompt_tokens, completion_tokens = _usage(payload)
    tokens, source = _tokens(choice, logprob_ids, text, tokenizer)
    if (
        source == "server"
        and completion_tokens is not None
        and len(tokens or ()) != completion_tokens
    ):
        raise _BadAnswer(f"{len(tokens or ())} token ids but usage says {completion_tokens}")
    return CompletionResult(
        text=text,
        tokens=tokens,
        token_source=source,
        finish_reason=finish_reason,
        seconds=seconds,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        logprobs=token_logprobs,
        attempts=attempt,
    )


def _first_choice(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise _BadAnswer(f"expected a JSON object, got {type(payload).__name__}")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _BadAnswer(f"no choices in {_snippet(json.dumps(payload))}")
    return choices[0]


def _tokens(
    choice: dict[str, Any],
    logprob_ids: list[int] | None,
    text: str,
    tokenizer: TextEncoder | None,
) -> tuple[list[int] | None, TokenSource]:
    token_ids = choice.get("token_ids")
    if token_ids is not None:
        if not isinstance(token_ids, list) or not all(_is_int(i) for i in token_ids):
            raise _BadAnswer(f"choices[0].token_ids is not a list of ints: {_snippet(token_ids)}")
        return token_ids, "server"
    if logprob_ids is not None:
        return logprob_ids, "logprobs"
    if tokenizer is not None:
        return tokenizer.encode(text), "tokenizer"
    return None, "none"


def _logprobs(
    choice: dict[str, Any], requested: int | None
) -> tuple[list[float] | None, list[int] | None]:
    """The chosen tokens' log-probabilities and, when spelled ``token_id:<id>``, their ids."""
    if requested is None:
        return None, None
    block = choice.get("logprobs")
    if not isinstance(block, dict):
        raise _BadAnswer("logprobs were requested but choices[0].logprobs is missing")
    values, tokens = block.get("token_logprobs"), block.get("tokens")
    if not isinstance(values, list) or not isinstance(tokens, list) or len(values) != len(tokens):
        raise _BadAnswer("choices[0].logprobs lacks matching token_logprobs / tokens lists")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise _BadAnswer("choices[0].logprobs.token_logprobs holds non-numbers")
    ids = None
    if tokens and all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        try:
            ids = [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
        except ValueError:
            raise _BadAnswer(f"bad token_id entries in logprobs: {_snippet(tokens)}") from None
    return [float(v) for v in values], ids


def _usage(payload: dict[str, Any]) -> tuple[int | None, int | None]:
    usage = payload.get("usage")
    if usage is None:
        return None, None
    if not isinstance(usage, dict):
        raise _BadAnswer(f"usage is not an object: {_snippet(usage)}")
    counts = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(c is None or (_is_int(c) and c >= 0) for c in counts):
        raise _BadAnswer(f"usage counts are not non-negative integers: {_snippet(usage)}")
    return counts


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _snippet(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
