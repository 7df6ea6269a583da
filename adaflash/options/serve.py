"""The serve group: the HTTP server (embedded or SGLang) and how clients reach one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting

DEFAULT_MAX_NEW_TOKENS_LIMIT = 2048  # one request may not hold a slot for longer than this many tokens
DEFAULT_URL = "http://127.0.0.1:30000"


@dataclass(frozen=True)
class ServeConfig(Settings):
    GROUP: ClassVar[str] = "serve"

    engine: str = setting("embedded", Rule(str, choices=("embedded", "sglang"), flag="--engine",
                                           help="embedded: our PyTorch engine (CPU or GPU); sglang: launch "
                                                "`python -m sglang.launch_server`."))
    host: str = setting("127.0.0.1", Rule(str, flag="--host", help="Interface to bind."))
    port: int = setting(30000, Rule(int, low=0, high=65535, flag="--port", help="Port (0: a free one)."))
    api_key: str | None = setting(None, Rule(str, optional=True, flag="--api-key", envvar="ADAFLASH_API_KEY",
                                             help="The server's bearer key: serve requires 'Authorization: Bearer "
                                                  "KEY', clients send it [env ADAFLASH_API_KEY]."))
    base_url: str | None = setting(None, Rule(str, optional=True, flag="--base-url",
                                              per_command=(("bench shift", DEFAULT_URL),),
                                              help="Server URL, e.g. http://127.0.0.1:30000 (ours or SGLang)."))
    gpus: str | None = setting(None, Rule(str, optional=True, flag="--gpus",
                                          help="GPU indices (0,1) or 'cpu' for the server(s): indices of the GPUs we "
                                               "see (under CUDA_VISIBLE_DEVICES=2,3, 0 is GPU 2); sets the server's "
                                               "CUDA_VISIBLE_DEVICES (and --tp-size for SGLang)."))
    max_new_tokens_limit: int = setting(DEFAULT_MAX_NEW_TOKENS_LIMIT, Rule(
        int, low=0, flag="--max-new-tokens-limit",
        help="Embedded: refuse requests asking for more new tokens (0: only the context limits them)."))
    header_timeout: float = setting(10.0, Rule(float, low=0, low_open=True, flag="--header-timeout",
                                               help="Embedded: seconds a connection has to send a whole request "
                                                    "head."))
    keepalive_timeout: float = setting(30.0, Rule(float, low=0, low_open=True, flag="--keepalive-timeout",
                                                  help="Embedded: seconds an idle keep-alive connection stays open."))
    served_model_name: str | None = setting(None, Rule(str, optional=True, flag="--served-model-name",
                                                       help="The model id clients name and /v1/models lists "
                                                            "(default: --target as given)."))
    max_connections: int | None = setting(None, Rule(int, optional=True, low=1, flag="--max-connections",
                                                     help="Embedded: connections open at once; the oldest idle ones "
                                                          "are closed to make room (default: what the open-files "
                                                          "limit allows)."))
    stream_interval: int = setting(1, Rule(int, low=1, flag="--stream-interval",
                                           help="Tokens a streamed answer gathers before its next chunk (its first "
                                                "and last go at once): 1 sends every step's; more writes fewer, larger "
                                                "chunks, for throughput at high concurrency (SGLang's flag)."))
    sglang_args: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--sglang-arg",
                                                    help="Extra SGLang arguments, appended verbatim (repeatable; "
                                                         "later flags override)."))
    serve_args: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--serve-arg",
                                                   help="Extra `adaflash serve` argument (repeatable, verbatim)."))
    server_url: str = setting(DEFAULT_URL, Rule(str, flag="--url", help="The server a client command acts on."))
    ready_timeout: float = setting(900.0, Rule(float, low=1, flag="--ready-timeout",
                                               help="Seconds to wait for each server's /health."))

    @property
    def url(self) -> str | None:
        return self.base_url.rstrip("/") if self.base_url else None
