"""The engine in a process of its own behind `adaflash serve`, fed a step at a time through a pipe.

Why: in one process the engine thread and the event loop share one interpreter lock, and streaming 64
answers, the loop's work a token (the chunk, its JSON, the socket write) stretched every engine step: on an
H100, Vanilla through the server ran at 58-75% of `bench engine` at batch 64. Here a child process owns the
Engine and runs `EngineLoop`'s loop (`_ChildLoop`); the server's process keeps HTTP, tokenizing and the
streams, and gets each step's tokens in one message. The child never touches a socket, the parent never
touches the device (`EngineFacts` mirrors what the server reads of the engine).

`serve --adapt` keeps the engine thread (`EngineLoop`): its trainer swaps drafters into the engine object.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine, StepEvent, check_request
from adaflash.engine.params import Request
from adaflash.models.layers import DecoderConfig
from adaflash.models.loading import Target
from adaflash.serve.engine_loop import (
    EngineLoop,
    Failure,
    Handle,
    TokenRate,
    load_swap_drafter,
    put_all,
    resolve_future,
)


class EngineStartError(RuntimeError):
    """The engine process could not build its engine (a bad drafter, a target that does not load)."""


@dataclass(frozen=True)
class EngineSpec:
    """What the child builds: `build_engine`'s arguments, and the server's stream interval."""

    target: str
    method: str
    draft: str | None
    config: EngineConfig
    device: str | None
    dtype: str | None
    stream_interval: int = 1

    def build(self) -> Engine:
        from adaflash.engine.build import build_engine

        engine = build_engine(self.target, self.method, self.draft, config=self.config, device=self.device,
                              dtype=self.dtype)
        if engine.graphs.enabled:
            started = time.perf_counter()
            count = engine.capture_graphs()
            print(f"captured {count} CUDA graphs in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        return engine


@dataclass
class DrafterFacts:
    block_size: int | None
    max_draft: int


@dataclass
class ModelFacts:
    cfg: DecoderConfig


@dataclass
class EngineFacts:
    """What the server reads of an engine in another process: fixed at its start, and what each step
    message brings (`update`). Attribute for attribute the Engine's, so the server reads either alike."""

    method: str
    folder: Path
    model: ModelFacts
    drafter: DrafterFacts | None
    max_batch: int
    admit_batch: int
    overlap: bool
    max_len: int
    context_margin: int
    length_rate: float
    length_policy: str
    min_length: int
    device: str
    hardware: str
    drafter_version: int | None = None
    avg_accept_length: float | None = None
    stats: dict[str, int] = field(default_factory=lambda: {"verify_ct": 0, "completion_tokens": 0, "requests": 0})
    passes: dict[str, dict[str, float]] = field(default_factory=dict)  # `pass_totals()` as last sent
    loop_times: dict[str, float] = field(default_factory=dict)  # the child loop's `LoopTimes.totals()` as last sent
    target: Target | None = None  # the tokenizer's side of the target, loaded in the server's process

    @classmethod
    def of(cls, engine: Engine) -> EngineFacts:
        from adaflash.serve.server import hardware_name

        drafter = engine.drafter
        return cls(method=engine.method, folder=Path(engine.target.folder), model=ModelFacts(engine.model.cfg),
                   drafter=None if drafter is None else DrafterFacts(getattr(drafter, "block_size", None), drafter.max_draft),
                   max_batch=engine.max_batch, admit_batch=engine.admit_batch, overlap=engine.overlap,
                   max_len=engine.max_len, context_margin=engine.context_margin, length_rate=engine.length_rate,
                   length_policy=engine.length_policy, min_length=engine.min_length, device=str(engine.device),
                   hardware=hardware_name(engine.device), drafter_version=engine.drafter_version)

    def check(self, request: Request) -> None:
        check_request(request, vocab=self.model.cfg.vocab_size, max_len=self.max_len, margin=self.context_margin,
                      drafts=self.drafter is not None)

    def update(self, snapshot: dict[str, Any]) -> None:
        self.drafter_version = snapshot["drafter_version"]
        self.avg_accept_length = snapshot["avg_accept_length"]
        self.stats = snapshot["stats"]
        self.passes = snapshot["passes"]
        self.loop_times = snapshot["loop"]

    def pass_totals(self) -> dict[str, dict[str, float]]:
        return self.passes


def _state_key(snapshot: dict[str, Any]) -> tuple:
    return (snapshot["running"], snapshot["queue_depth"], snapshot["stats"]["requests"], snapshot["drafter_version"],
            snapshot["error"])


def _snapshot(loop: EngineLoop) -> dict[str, Any]:
    engine = loop.engine
    return {"drafter_version": engine.drafter_version, "avg_accept_length": engine.avg_accept_length,
            "stats": dict(engine.stats), "passes": engine.pass_totals(), "loop": loop.times.totals(),
            "running": len(engine.active),
            "queue_depth": loop.queue_depth,
            "error": loop.error}


class _ChildLoop(EngineLoop):
    """`EngineLoop` in the engine's process: what it would post to the event loop goes down the pipe."""

    def __init__(self, engine: Engine, conn: Connection, stream_interval: int) -> None:
        super().__init__(engine, None, stream_interval)  # type: ignore[arg-type]  # no event loop here
        self.conn = conn
        self.sending = threading.Lock()  # the engine thread and a swap's loader both send
        self._sent: tuple | None = None  # what the server last heard of the engine's state

    def send(self, message: tuple) -> None:
        """A message, with the engine's state as its last item."""
        snapshot = _snapshot(self)
        self._sent = _state_key(snapshot)
        with self.sending:
            self.conn.send((*message, snapshot))

    def _deliver(self, ready: list[tuple[Handle, list]]) -> None:
        self.send(("events", [(event.rid, event.new_ids, event.output) for _handle, events in ready for event in events]))

    def _fail(self, handle: Handle, failure: Failure) -> None:
        self.send(("fail", handle.rid, failure.message, failure.status))

    def _answer(self, future: Any, result: Any, error: BaseException | None) -> None:
        self.send(("answer", future, None if error is None else str(error)))

    def _drain(self, block: bool) -> None:
        super()._drain(block)
        self._tell_state()

    def _tell_state(self) -> None:
        """The engine's state, when it changed without a message (an abort, a step whose tokens are held)."""
        if _state_key(_snapshot(self)) != self._sent:
            self.send(("state",))

    def receive(self) -> None:
        """The pipe's messages into the engine thread's inbox, until the server says stop or is gone."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                message = None
            if message is None:
                self.stop(timeout=0)
                return
            kind = message[0]
            if kind == "group":
                self.submit_group([(request, Handle(request.rid, None, 0.0)) for request in message[1]])  # type: ignore[arg-type]
            elif kind == "abort":
                self.abort(message[1])
            elif kind == "swap":
                threading.Thread(target=self._load_and_swap, args=message[1:], daemon=True).start()

    def _load_and_swap(self, token: int, path: str, version: int | None) -> None:
        try:
            drafter = load_swap_drafter(self.engine, path)
        except (ValueError, OSError) as err:
            self._answer(token, None, err)
            return
        self.inbox.put(("call", lambda engine: engine.swap_drafter(drafter, version), token))


def _child(spec: EngineSpec, conn: Connection) -> None:
    """The engine process: build, say ready with the engine's facts, then loop until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops it: a terminal's Ctrl-C reaches both
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = spec.build()
        facts = EngineFacts.of(engine)
    except Exception as err:  # reported to the server, which fails with it
        conn.send(("failed", f"{type(err).__name__}: {err}" if not isinstance(err, (ValueError, OSError)) else str(err)))
        return
    conn.send(("ready", facts))
    loop = _ChildLoop(engine, conn, spec.stream_interval)
    threading.Thread(target=loop.receive, name="adaflash-engine-pipe", daemon=True).start()
    loop._run()


class EngineProcess:
    """The server's side: `EngineLoop`'s interface, with the engine in a child process."""

    def __init__(self, spec: EngineSpec) -> None:
        context = multiprocessing.get_context("spawn")  # the server's threads must not be forked
        self.conn, child_end = context.Pipe()
        self._child_end = child_end
        self.process = context.Process(target=_child, args=(spec, child_end), name="adaflash-engine", daemon=True)
        self.facts: EngineFacts | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.handles: dict[str, Handle] = {}
        self.futures: dict[int, asyncio.Future] = {}
        self._tokens = itertools.count()
        self.error: str | None = None
        self.running = 0
        self.queue_depth = 0
        self.stopping = threading.Event()
        self.exited = False  # the child's pipe closed
        self.sending = threading.Lock()
        self.rate = TokenRate()
        self._reader = threading.Thread(target=self._read, name="adaflash-engine-reader", daemon=True)

    def start_engine(self) -> EngineFacts:
        """Start the child and wait until its engine is built (graphs captured): its facts, with the target's
        tokenizer loaded here. EngineStartError says why it could not build."""
        self.process.start()
        self._child_end.close()
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            raise EngineStartError(f"the engine process exited (code {self.process.exitcode}) before it was ready") from None
        if message[0] == "failed":
            self.process.join(10)
            raise EngineStartError(message[1])
        facts: EngineFacts = message[1]
        target = Target(name=str(facts.folder), folder=facts.folder, model=None, tokenizer=None, eos_ids=[])  # type: ignore[arg-type]
        target.ensure_tokenizer()
        facts.target = target
        self.facts = facts
        return facts

    # -- EngineLoop's interface, on the event loop's thread ---------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start handing the child's messages to `loop` (the server's startup)."""
        self.loop = loop
        self._reader.start()

    @property
    def alive(self) -> bool:
        return not self.exited and self.process.is_alive() and self._reader.is_alive() and not self.stopping.is_set()

    def submit(self, request: Request, handle: Handle) -> None:
        self.submit_group([(request, handle)])

    def submit_group(self, pairs: list[tuple[Request, Handle]]) -> None:
        for request, handle in pairs:
            self.handles[request.rid] = handle
        self._send(("group", [request for request, _ in pairs]))

    def abort(self, rid: str) -> None:
        self.handles.pop(rid, None)
        self._send(("abort", rid))

    async def swap(self, path: str, version: int | None) -> None:
        """`EngineLoop.swap`, done by the child: ValueError says why the drafter cannot serve."""
        assert self.loop is not None
        token = next(self._tokens)
        future = self.futures[token] = self.loop.create_future()
        self._send(("swap", token, path, version))
        error = await future
        if error is not None:
            raise ValueError(error)

    def loop_times(self) -> dict[str, float]:
        return self.facts.loop_times if self.facts is not None else {}

    def gen_throughput(self, window: float = 10.0) -> float:
        return self.rate.per_second(window)

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        if self.process.is_alive():
            with contextlib.suppress(OSError, ValueError):  # the child is gone already
                self._send(None)
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout)
        self.conn.close()

    def _send(self, message: tuple | None) -> None:
        with self.sending:
            self.conn.send(message)

    # -- the reader thread ---------------------------------------------------------------------------------
    def _read(self) -> None:
        assert self.loop is not None and self.facts is not None
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            kind, snapshot = message[0], message[-1]
            self.facts.update(snapshot)
            self.running, self.queue_depth, self.error = snapshot["running"], snapshot["queue_depth"], snapshot["error"]
            if kind == "events":
                self._hand_out(message[1])
            elif kind == "fail":
                handle = self.handles.pop(message[1], None)
                if handle is not None:
                    self._post(handle.queue.put_nowait, Failure(message[2], message[3]))
            elif kind == "answer":
                future = self.futures.pop(message[1], None)
                if future is not None:
                    self._post(resolve_future, future, message[2], None)
        self.exited = True  # before any request hears of it: from then on the server answers 503
        if not self.stopping.is_set():
            self.process.join(1)
            self.error = f"the engine process exited (code {self.process.exitcode})"
            failure = Failure(self.error, 500)
            for rid in list(self.handles):
                handle = self.handles.pop(rid, None)
                if handle is not None:
                    self._post(handle.queue.put_nowait, failure)
            for token in list(self.futures):  # a swap waiting for its answer
                future = self.futures.pop(token, None)
                if future is not None:
                    self._post(resolve_future, future, self.error, None)

    def _hand_out(self, items: list[tuple[str, list[int], Any]]) -> None:
        ready: dict[str, tuple[Handle, list[StepEvent]]] = {}
        tokens = 0
        for rid, new_ids, output in items:
            tokens += len(new_ids)
            handle = self.handles.get(rid)
            if handle is None:
                continue
            if output is not None:
                del self.handles[rid]
            ready.setdefault(rid, (handle, []))[1].append(StepEvent(rid, new_ids, output))
        self.rate.add(tokens)
        if ready:
            self._post(put_all, [(handle.queue, events) for handle, events in ready.values()])

    def _post(self, fn: Any, *args: Any) -> None:
        assert self.loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody is waiting any more
            self.loop.call_soon_threadsafe(fn, *args)
