"""The AR model served by transformers and vLLM, side by side with ours; results/.

DVC stage ``baseline``: the AR model served by other engines, side by side with our decoder.

``setdiff baseline --task arith`` reads ``baseline`` and writes ``results/baseline/<task>.csv``
(tidy rows, `setdiff.measure` contract) and ``results/baseline/<task>.json`` (which engine ran,
which was unavailable and why, fingerprint). The AR model ``models/<task>/ar`` is exported to
the Hugging Face format (``models/<task>/ar-hf``) and decoded greedily by:
- ``setdiff``: our KV-cached AR decoder (in process) — the reference every engine is paired with;
- ``transformers``: ``generate`` with KV cache on the exported checkpoint;
- ``vllm``: the exported checkpoint behind vLLM's OpenAI-compatible server (started here on
  127.0.0.1 from the vLLM environment, or ``baseline.vllm.base_url``), called with the openai
  client; also at concurrency 1..N for the throughput regime (``vllm.concurrency``);
- ``vllm+ngram k=K`` (``vllm.speculative_tokens``): the same with vLLM's speculative decoding,
  its n-gram (prompt lookup) proposer drafting K tokens per step, on a server of its own started
  once the others stopped, timed beside our decoder again (`_speculative_rows`). vLLM
  refuses ``logit_bias`` with speculative decoding, so [MASK] is not suppressed there: the
  tokens of every engine are compared with our decoder's on every prompt
  (``identical_to_setdiff`` in the JSON), which shows any difference.
Latency rows interleave the engines per example. The throughput regime of our AR
(`generate_batch`) and transformers (left-padded batched ``generate``) decodes the same prompts in
batches of each of ``batch_sizes`` (interleaved per batch size, warm-up excluded): aggregate
tokens/s by batch size and whether every row equals its smallest-batch decode, in the JSON beside
vLLM's by concurrency. If vLLM cannot run, the stage fails with the
reason unless ``baseline.vllm.on_unavailable: skip`` is set, in which case the JSON says it was
skipped and why: no engine is ever silently substituted for another.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from setdiff.artifacts import LoadedModel, load_model
from setdiff.baselines.config import BaselineConfig, VLLMConfig
from setdiff.config import to_dict
from setdiff.evaluate import score_answer
from setdiff.files import write_json
from setdiff.measure import Row, count_new_tokens, fingerprint, peak_memory_mb, timed, write_rows
from setdiff.preset import Preset
from setdiff.progress import progress_bar
from setdiff.runtime import setup_torch
from setdiff.sampling.loop import generate, generate_batch
from setdiff.stages.common import start
from setdiff.study import StudyConfig
from setdiff.tasks import read_records

log = logging.getLogger(__name__)

PARAMS: tuple[str, ...] = ("baseline",)
"""The params keys this stage reads, as its DVC stage lists them (a test checks both)."""

SECTION = "baseline"
"""The params section this stage owns (`check_preset` validates it)."""


def check_preset(preset: Preset, study: StudyConfig) -> None:
    """Preset validation (`setdiff.validate`): ``baseline`` (required) builds."""
    preset.section("baseline", BaselineConfig)


def main(argv: list[str]) -> None:
    args, preset, layout = start(argv, "AR baselines served by other engines.", answers=True)
    config = preset.section("baseline", BaselineConfig)
    setup_torch(threads=config.threads or None)
    from setdiff.hf import export_hf

    expect = {"paradigm": "ar", "task": args.task, "tokenizer": layout.tokenizer}
    own = load_model(layout.model("ar"), device=config.device, **expect)
    hf_dir = export_hf(layout.model("ar"), layout.model("ar-hf"))
    records = read_records(layout.raw / "test.jsonl", args.task)[: config.n_examples]
    warm = read_records(layout.raw / "valid.jsonl", args.task)[: config.warmup]
    prompts = [[own.tokenizer.bos_id] + own.tokenizer.encode(r["prompt"]) for r in records]
    warm_prompts = [[own.tokenizer.bos_id] + own.tokenizer.encode(r["prompt"]) for r in warm]
    status: dict[str, Any] = {}
    batched: dict[str, BatchDecoder] = {}
    with _engines(config, hf_dir, own, status, batched) as engines:
        rows, identical = _latency_rows(args.task, own, engines, prompts, warm_prompts, records)
        for name, same in identical.items():
            status[name] |= {"identical_to_setdiff": same, "n": len(prompts)}
        regime = _batched(
            batched,
            prompts,
            warm_prompts,
            config.batch_sizes,
            own.tokenizer.eos_id,
            torch.device(config.device),
        )
        for name, figures in regime.items():
            status[name] |= figures
        if "vllm" in engines:
            more, status["vllm"]["throughput"] = _throughput_rows(
                args.task, own, engines["vllm"], prompts, records, config
            )
            rows += more
        ours = engines["setdiff"]
        vllm_ran = "vllm" in engines
    for k in config.vllm.speculative_tokens if vllm_ran else ():
        rows += _speculative_rows(
            args.task, config, hf_dir, own, ours, k, status, prompts, warm_prompts, records
        )
    out = layout.root / "results" / "baseline" / f"{args.task}.csv"
    write_rows(out, rows)
    write_json(
        out.with_suffix(".json"),
        {
            "task": args.task,
            "config": to_dict(config),
            "engines": status,
            "fingerprint": fingerprint(
                torch.device(config.device),
                params_hash=preset.digest("baseline"),
                checkpoints={"ar": layout.model("ar")},
            ),
        },
    )
    log.info("wrote %d rows to %s; engines: %s", len(rows), out, status)


Decoder = Callable[[list[int]], tuple[list[int], float]]
"""prompt ids -> (new token ids, seconds)."""
BatchDecoder = Callable[[list[list[int]]], tuple[list[list[int]], float, int]]
"""prompts -> (new token ids per row, seconds of the batch, its batched forwards)."""


@contextlib.contextmanager
def _engines(
    config: BaselineConfig,
    hf_dir: Path,
    own: LoadedModel,
    status: dict[str, Any],
    batched: dict[str, BatchDecoder],
) -> Iterator[dict[str, Decoder]]:
    """Decoders by engine name, own AR first; vLLM's server lives as long as the context.
    `batched` gets the batch decoders of our AR (`generate_batch`) and transformers."""
    eos, seq_len = own.tokenizer.eos_id, own.net.config.max_seq_len
    device = torch.device(config.device)

    def ours(prompt: list[int]) -> tuple[list[int], float]:
        result, seconds = timed(
            lambda: generate(own, prompt, max_new_tokens=seq_len - len(prompt), stop_ids=[eos]),
            device,
        )
        return result.tokens, seconds

    def ours_batch(prompts: list[list[int]]) -> tuple[list[list[int]], float, int]:
        budget = [seq_len - len(p) for p in prompts]
        results, seconds = timed(
            lambda: generate_batch(own, prompts, max_new_tokens=budget, stop_ids=[eos]), device
        )
        return [r.tokens for r in results], seconds, max(r.nfe for r in results)

    engines: dict[str, Decoder] = {"setdiff": ours}
    batched["setdiff"] = ours_batch
    status["setdiff"] = {"status": "ran"}
    if "transformers" in config.engines:
        from setdiff.baselines.hf_engine import hf_generate, hf_generate_batch, load_hf_model

        model = load_hf_model(hf_dir, device=config.device)
        engines["transformers"] = lambda p: _pick(hf_generate(model, p, seq_len - len(p), eos))
        batched["transformers"] = lambda ps: _pick_batch(
            hf_generate_batch(model, ps, [seq_len - len(p) for p in ps], eos)
        )
        status["transformers"] = {"status": "ran"}
    with contextlib.ExitStack() as stack:
        if "vllm" in config.engines:
            engines_vllm = _vllm(config.vllm, hf_dir, own, stack, status)
            if engines_vllm is not None:
                engines["vllm"] = engines_vllm
        yield engines


def _speculative_rows(
    task: str,
    config: BaselineConfig,
    hf_dir: Path,
    own: LoadedModel,
    ours: Decoder,
    k: int,
    status: dict[str, Any],
    prompts: list[list[int]],
    warm: list[list[int]],
    records: list[dict[str, Any]],
) -> list[Row]:
    """vLLM with n-gram speculation (k tokens per step) on a server of its own, started after the
    plain server stopped and alone: a vLLM server busy-polls its cores, so servers alive side by
    side slowed each other 10x (31 vs 351 tokens/s on 2 cores). It is timed interleaved per
    prompt with our decoder again, whose rows here are labelled ``greedy beside <engine>`` and
    are the reference of that engine's speed ratio (`setdiff.stages.tradeoff.engines`)."""
    name = f"vllm+ngram k={k}"
    with contextlib.ExitStack() as stack:
        spec = _vllm(config.vllm, hf_dir, own, stack, status, name, ngram=k)
        if spec is None:
            return []
        pair = {"setdiff": ours, name: spec}
        rows, identical = _latency_rows(
            task, own, pair, prompts, warm, records, reference=f"greedy beside {name}"
        )
    status[name] |= {"identical_to_setdiff": identical[name], "n": len(prompts)}
    return rows


def _pick(out: dict[str, Any]) -> tuple[list[int], float]:
    return list(out["tokens"]), float(out["seconds"])


def _pick_batch(out: dict[str, Any]) -> tuple[list[list[int]], float, int]:
    return [list(t) for t in out["tokens"]], float(out["seconds"]), int(out["forwards"])


def _vllm(
    config: VLLMConfig,
    hf_dir: Path,
    own: LoadedModel,
    stack: contextlib.ExitStack,
    status: dict[str, Any],
    name: str = "vllm",
    ngram: int = 0,
) -> Decoder | None:
    """vLLM's greedy decoder, served here (or at ``base_url``); with `ngram` = k, a server of its
    own with speculative decoding by its n-gram proposer (k tokens per step). Records in
    `status[name]` whether it ran, or why not."""
    from setdiff.baselines.openai_client import complete, make_client
    from setdiff.baselines.vllm_server import VLLMServer

    seq_len, tok = own.net.config.max_seq_len, own.tokenizer
    extra: list[str] = []
    if ngram:
        proposer = {"method": "ngram", "num_speculative_tokens": ngram}
        proposer |= {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
        extra = ["--speculative-config", json.dumps(proposer)]
    try:
        if config.base_url is None or ngram:
            server = stack.enter_context(
                VLLMServer(
                    hf_dir,
                    max_model_len=seq_len,
                    startup_timeout_s=config.startup_timeout_s,
                    extra_args=extra,
                )
            )
            base_url, served = server.base_url, server.served_model_name
        else:
            base_url, served = config.base_url, hf_dir.name
        client = stack.enter_context(make_client(base_url, timeout=config.timeout_s))
    except (OSError, RuntimeError, ValueError) as err:
        reason = f"{type(err).__name__}: {err}"
        if config.on_unavailable == "fail":
            raise RuntimeError(
                f"vLLM is unavailable ({reason}); install it (make vllm-env) or "
                "set baseline.vllm.on_unavailable: skip"
            ) from err
        status[name] = {"status": "skipped", "reason": reason}
        log.warning("%s skipped: %s", name, reason)
        return None
    status[name] = {"status": "ran", "base_url": base_url}
    if ngram:
        status[name] |= {"speculative": {"method": "ngram", "num_speculative_tokens": ngram}}

    def decode(prompt: list[int]) -> tuple[list[int], float]:
        out = complete(
            base_url,
            served,
            prompt,
            seq_len - len(prompt),
            eos_id=tok.eos_id,
            suppress_ids=() if ngram else [tok.mask_id],  # no logit_bias with speculation
            tokenizer=tok,
            timeout=config.timeout_s,
            retries=config.retries,
            client=client,
        )
        if out.tokens is None:
            raise RuntimeError("vLLM returned no token ids and they could not be recovered")
        return out.tokens, out.seconds

    return decode


def _row(
    task: str,
    engine: str,
    own: LoadedModel,
    prompt: list[int],
    tokens: list[int],
    seconds: float,
    record: dict[str, Any],
    index: int,
    regime: str = "latency",
    concurrency: int = 1,
    label: str = "greedy",
) -> Row:
    n_new = count_new_tokens(tokens, [own.tokenizer.eos_id])
    text = own.tokenizer.decode(tokens[:n_new])
    _, score = score_answer(task, text, record)
    if regime != "latency":
        label = f"{label} concurrency={concurrency}"
    return Row(
        task=task,
        paradigm="ar",
        engine=engine,
        config=label,
        window=None,
        threshold=None,
        regime=regime,
        concurrency=concurrency,
        example=index,
        prompt_tokens=len(prompt),
        new_tokens=n_new,
        nfe=n_new,
        latency_s=seconds,
        forward_s=None,
        peak_mem_mb=peak_memory_mb(torch.device("cpu")),
        kv_cache_mb=None,
        score=score,
        exact=float(score == 1.0),
        stopped=n_new < len(tokens) or own.tokenizer.eos_id in tokens,
    )


def _latency_rows(
    task: str,
    own: LoadedModel,
    engines: dict[str, Decoder],
    prompts: list[list[int]],
    warm: list[list[int]],
    records: list[dict[str, Any]],
    reference: str = "greedy",
) -> tuple[list[Row], dict[str, int]]:
    """Every engine on every prompt, interleaved per example (after the warm-up prompts); the
    rows (our decoder's labelled `reference`), and per engine the prompts whose answer equals
    our decoder's (`_identical`)."""
    for prompt in warm:
        for decode in engines.values():
            decode(prompt)
    rows, decoded = [], {name: [] for name in engines}
    for i, prompt in enumerate(progress_bar(prompts, desc=f"baseline {task}")):
        for name, decode in engines.items():
            tokens, seconds = decode(prompt)
            decoded[name].append(tokens)
            label = reference if name == "setdiff" else "greedy"
            rows.append(_row(task, name, own, prompt, tokens, seconds, records[i], i, label=label))
    return rows, _identical(decoded, own.tokenizer.eos_id)


def _identical(tokens: dict[str, list[list[int]]], eos_id: int) -> dict[str, int]:
    """Per engine: the prompts on which its new tokens, up to and including EOS, equal our
    decoder's."""

    def answer(t: list[int]) -> list[int]:
        return t[: count_new_tokens(t, [eos_id])]

    ours = [answer(t) for t in tokens["setdiff"]]
    return {
        engine: sum(answer(t) == o for t, o in zip(got, ours, strict=True))
        for engine, got in tokens.items()
    }


def _batched(
    engines: dict[str, BatchDecoder],
    prompts: list[list[int]],
    warm: list[list[int]],
    batch_sizes: tuple[int, ...],
    eos_id: int,
    device: torch.device,
) -> dict[str, dict[str, Any]]:
    """Our AR and transformers decoding the prompts in batches of each of ``batch_sizes``,
    interleaved per batch size, each after a full-size warm-up batch of the warm-up prompts
    (excluded), by batch size: ``throughput`` (all rows' new tokens, up to and including EOS,
    over the wall time of all batches), ``forwards`` (their batched forwards) and
    ``peak_mem_mb`` (`setdiff.measure.peak_memory_mb` after them: on CPU the process's peak
    RSS, shared by every engine in this process); and ``rows_equal_smallest_batch`` (every
    row's tokens equal to its decode in the smallest batch)."""
    seconds = {name: dict.fromkeys(batch_sizes, 0.0) for name in engines}
    forwards = {name: dict.fromkeys(batch_sizes, 0) for name in engines}
    peak = {name: dict.fromkeys(batch_sizes, 0.0) for name in engines}
    tokens: dict[str, dict[int, list[list[int]]]] = {
        name: {b: [] for b in batch_sizes} for name in engines
    }
    for size in batch_sizes:
        for name, decode in engines.items():
            if warm:  # a full-size batch, so that first-touch allocations are not timed
                decode((warm * size)[:size])
            for first in range(0, len(prompts), size):
                rows, took, n_forwards = decode(prompts[first : first + size])
                seconds[name][size] += took
                forwards[name][size] += n_forwards
                tokens[name][size].extend(rows)
            peak[name][size] = peak_memory_mb(device)
    out: dict[str, dict[str, Any]] = {}
    for name in engines:
        first = tokens[name][min(batch_sizes)]
        new = {b: sum(count_new_tokens(t, [eos_id]) for t in tokens[name][b]) for b in batch_sizes}
        out[name] = {
            "throughput": {str(b): new[b] / seconds[name][b] for b in batch_sizes},
            "forwards": {str(b): forwards[name][b] for b in batch_sizes},
            "peak_mem_mb": {str(b): peak[name][b] for b in batch_sizes},
            "rows_equal_smallest_batch": all(rows == first for rows in tokens[name].values()),
        }
        log.info("%s batched tokens/s: %s", name, out[name]["throughput"])
    return out


def _throughput_rows(
    task: str,
    own: LoadedModel,
    decode: Decoder,
    prompts: list[list[int]],
    records: list[dict[str, Any]],
    config: BaselineConfig,
) -> tuple[list[Row], dict[str, float]]:
    """vLLM at each concurrency: requests in flight at once; latency is per request, and the
    aggregate tokens/s (all tokens over the wall time of the batch) is returned by concurrency."""
    rows, aggregate = [], {}
    for n in config.vllm.concurrency:
        tic = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(decode, prompts))
        wall = time.perf_counter() - tic
        for i, (tokens, seconds) in enumerate(results):
            rows.append(
                _row(
                    task,
                    "vllm",
                    own,
                    prompts[i],
                    tokens,
                    seconds,
                    records[i],
                    i,
                    regime="throughput",
                    concurrency=n,
                )
            )
        aggregate[str(n)] = sum(r.new_tokens for r in rows[-len(prompts) :]) / wall
        log.info("vLLM concurrency %d: %.1f tokens/s", n, aggregate[str(n)])
    return rows, aggregate
