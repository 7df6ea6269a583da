"""The engine thread behind the HTTP server.

The engine is not thread-safe and batches best when it sees every live request, so ONE thread owns
it and loops "take new requests -> engine.step() -> hand out StepEvents". The asyncio side submits
requests and posted calls through a queue and waits on a per-request mailbox (`Mailbox`) that this thread
feeds through `loop.call_soon_threadsafe`: once a step for all its requests, since every call wakes
the event loop (a write to its self-pipe) and at large batches the event loop, sharing the GIL, is
what limits a server. `stream_interval` holds a request's tokens back until that many have come
(its first and its last go at once), so a stream writes fewer, larger chunks, as SGLang's flag does.

Fairness: the prompts of one HTTP request form a group, and the engine's own queue is only topped up
to its free slots, taking one prompt from each waiting group in turn (round-robin). So a request of
4,096 prompts shares the engine with a one-prompt request that comes after it instead of making it
wait for all 4,096.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import sys
import threading
import time
import traceback
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from adaflash.engine.detokenize import TextSoFar
from adaflash.engine.engine import Engine, fitting_drafter
from adaflash.engine.params import Request
from adaflash.methods import method_of
from adaflash.models.drafters import Drafter
from adaflash.serve.http_errors import error_body


@dataclass
class Failure:
    message: str
    status: int = 500

    def body(self) -> dict[str, Any]:
        """The error a stream sends for it (a stream has already answered 200)."""
        return error_body(self.message, "BadRequest" if self.status == 400 else "InternalServerError",
                          code=self.status)


class Mailbox:
    """A request's events, put by the engine thread's calls on the event loop and taken all at once by its
    handler. asyncio.Queue does the same a put and a get at a time, about 1 µs more an event, which a
    server streaming 64 answers pays 64 times a step on the thread that shares the interpreter lock with
    the engine. Used on the event loop's thread only."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list = []
        self._waiter: asyncio.Future | None = None

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        self._wake()

    def put_all(self, items: list) -> None:
        self._items.extend(items)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list:
        """Every event put since the last take; waits for one if there is none."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items

    def empty(self) -> bool:
        return not self._items


@dataclass
class Handle:
    """One request in flight, seen from the asyncio side."""

    rid: str
    queue: Mailbox
    arrived: float
    prompt_tokens: int = 0
    ids: list[int] = field(default_factory=list)
    ids_json: str = ""  # a stream's `ids` as JSON list items, its first `ids_json_count`: each chunk carries every id
    ids_json_count: int = 0
    rid_json: str = ""  # the rid as JSON, for a stream's chunks
    steps: int = 0
    first_at: float | None = None
    last_at: float | None = None  # when its latest tokens arrived (inter-token latency)
    probe: bool = False  # a health check's: left out of the metrics
    stops: list[str] = field(default_factory=list)  # stop strings: a stream holds back what may start one
    so_far: TextSoFar | None = None  # a stream's text of `ids`, decoded in windows
    done: bool = False  # its output or failure was taken (else the handler aborts it when it ends)
    prompt_ids: list[int] = field(default_factory=list)  # kept only on an adapting server (its training rows)
    adapt: bool = True  # may an adapting server train on it
    tag: str | None = None  # its domain, for τ per tag
    held: list = field(default_factory=list)  # the engine thread's: events not yet handed out (stream interval)
    held_tokens: int = 0
    handed_tokens: int = 0


class EngineLoop:
    """The engine thread: owns the Engine, batches whatever is queued, feeds per-request mailboxes."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop, stream_interval: int = 1) -> None:
        self.engine = engine
        self.loop = loop
        self.stream_interval = stream_interval
        self.inbox: queue.Queue = queue.Queue()
        self.handles: dict[str, Handle] = {}
        self.groups: OrderedDict[int, deque[tuple[Request, Handle]]] = OrderedDict()  # waiting, by HTTP request
        self.waiting_rids: Counter[str] = Counter()  # rids in `groups` not aborted (a rid may come back)
        self.dropped: Counter[str] = Counter()  # rids in `groups` whose client left: skipped at their turn
        self._group_ids = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="adaflash-engine", daemon=True)
        self.error: str | None = None
        self.heartbeat = time.monotonic()
        self.steps = 0
        self.rate = TokenRate()
        self.times = LoopTimes()

    # -- called from the asyncio side ---------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.inbox.put(None)
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and not self.stopping.is_set()

    def submit(self, request: Request, handle: Handle) -> None:
        self.submit_group([(request, handle)])

    def submit_group(self, pairs: list[tuple[Request, Handle]]) -> None:
        """The prompts of one HTTP request: they take turns with other requests' prompts for free slots."""
        self.inbox.put(("group", pairs))

    def abort(self, rid: str) -> None:
        """Drop a request whose client left, between two steps."""
        self.inbox.put(("abort", rid))

    def call(self, fn: Callable[[Engine], Any]) -> asyncio.Future:
        """Run fn(engine) on the engine thread between two steps; the future gets its result."""
        future = self.loop.create_future()
        self.inbox.put(("call", fn, future))
        return future

    async def swap(self, path: str, version: int | None) -> None:
        """Load the drafter in `path` off the engine thread, then swap it in between two steps; ValueError or
        OSError says why it cannot serve (`POST /update_weights_from_disk`)."""
        drafter = await asyncio.get_running_loop().run_in_executor(None, load_swap_drafter, self.engine, path)
        await self.call(lambda engine: engine.swap_drafter(drafter, version))

    def call_from_thread(self, fn: Callable[[Engine], Any]) -> concurrent.futures.Future:
        """`call` for a thread other than the event loop's (the adapt thread): a blocking-capable future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.inbox.put(("call", fn, future))
        return future

    @property
    def queue_depth(self) -> int:
        return self.inbox.qsize() + self.waiting_rids.total() + len(self.engine.waiting)

    @property
    def running(self) -> int:
        return len(self.engine.active)

    def loop_times(self) -> dict[str, float]:
        """`LoopTimes.totals()`: where the engine thread's time went since the start."""
        return self.times.totals()

    def gen_throughput(self, window: float = 10.0) -> float:
        return self.rate.per_second(window)

    # -- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        while not self.stopping.is_set():
            self._drain(block=not self.engine.has_work() and not self.groups)
            if self.stopping.is_set():
                break
            self._feed()
            if not self.engine.has_work():
                continue
            self.times.start(len(self.engine.active))
            try:
                events = self.engine.step()
            except Exception as err:  # the engine failed mid-step: fail what is in flight, keep serving
                self._fail_all(f"engine step failed: {type(err).__name__}: {err}")
                continue
            self.times.stop(busy=self.engine.has_work())
            self.steps += 1
            self.heartbeat = time.monotonic()
            self._hand_out(events)
            self.rate.add(sum(len(event.new_ids) for event in events))

    def _hand_out(self, events: list) -> None:
        """A step's events to their requests' queues, in one call to the event loop."""
        ready: list[tuple[Handle, list]] = []
        for event in events:
            handle = self.handles.get(event.rid)
            if handle is None:
                continue
            handle.held.append(event)
            handle.held_tokens += len(event.new_ids)
            if event.output is not None:
                del self.handles[event.rid]
            elif not handle.held_tokens or (handle.handed_tokens and handle.held_tokens < self.stream_interval):
                continue  # the first tokens go at once (time to first token), then every stream_interval
            ready.append((handle, handle.held))
            handle.handed_tokens += handle.held_tokens
            handle.held, handle.held_tokens = [], 0
        if ready:
            self._deliver(ready)

    # -- how events and answers reach the requests (`engine_process` sends them to another process) --
    def _deliver(self, ready: list[tuple[Handle, list]]) -> None:
        """A step's events for their handles, in one call to the event loop."""
        self._post(put_all, [(handle.queue, items) for handle, items in ready])

    def _fail(self, handle: Handle, failure: Failure) -> None:
        self._post(handle.queue.put_nowait, failure)

    def _answer(self, future: Any, result: Any, error: BaseException | None) -> None:
        """A posted call's result for its future: an asyncio one (`call`) or a thread's (`call_from_thread`)."""
        if not isinstance(future, concurrent.futures.Future):
            self._post(resolve_future, future, result, error)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.1) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self._handle(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _feed(self) -> None:
        """Top the engine's queue up to its free slots, one prompt from each waiting group in turn."""
        engine = self.engine
        free = engine.max_batch - len(engine.active) - len(engine.waiting)
        while free > 0 and self.groups:
            key, group = next(iter(self.groups.items()))
            request, handle = group.popleft()
            if group:
                self.groups.move_to_end(key)
            else:
                del self.groups[key]
            if self.dropped[request.rid] > 0:
                _take(self.dropped, request.rid)
                continue
            _take(self.waiting_rids, request.rid)
            try:
                engine.add(request)
            except ValueError as err:
                self._fail(handle, Failure(str(err), 400))
                continue
            self.handles[request.rid] = handle
            free -= 1

    def _handle(self, item: tuple) -> None:
        if item[0] == "group":
            self._group_ids += 1
            self.groups[self._group_ids] = deque(item[1])
            self.waiting_rids.update(request.rid for request, _ in item[1])
        elif item[0] == "abort":
            if self.handles.pop(item[1], None) is not None:
                self.engine.abort(item[1])
            elif self.waiting_rids[item[1]] > 0:
                _take(self.waiting_rids, item[1])
                self.dropped[item[1]] += 1
        elif item[0] == "call":
            _, fn, future = item
            try:
                result, error = fn(self.engine), None
            except Exception as err:
                result, error = None, err
            self._answer(future, result, error)

    def _post(self, fn: Callable, *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody is waiting any more
            self.loop.call_soon_threadsafe(fn, *args)

    def _fail_all(self, message: str) -> None:
        traceback.print_exc(file=sys.stderr)
        self.error = message
        for handle in self.handles.values():
            self._fail(handle, Failure(message, 500))
        self.handles.clear()
        self.engine.waiting.clear()
        self.engine.active.clear()


class LoopTimes:
    """Where a serving engine's time goes, for `/get_server_info` (`engine_loop`): its steps, the rows in the
    batch as each began, the time inside `engine.step`, and the time between one step and the next while
    work was waiting (handing tokens to the requests, taking new ones in). Why: set beside `bench engine`'s
    figures at the same batch, they tell a server's slots left empty from its steps grown longer and from
    its loop's own cost."""

    def __init__(self) -> None:
        self.steps = self.rows = 0
        self.inside = self.between = 0.0
        self._began = self._ended = 0.0
        self._busy = False  # work was left when the last step ended: the time until the next one counts

    def start(self, rows: int) -> None:
        self._began = time.perf_counter()
        if self._busy:
            self.between += self._began - self._ended
        self.rows += rows

    def stop(self, *, busy: bool) -> None:
        self._ended = time.perf_counter()
        self.inside += self._ended - self._began
        self.steps += 1
        self._busy = busy

    def totals(self) -> dict[str, float]:
        return {"steps": self.steps, "rows": self.rows, "inside_seconds": self.inside, "between_seconds": self.between}


class TokenRate:
    """Tokens handed out over the last 30 s, for `gen_throughput` (SGLang's `last_gen_throughput`)."""

    def __init__(self) -> None:
        self._recent: deque[tuple[float, int]] = deque()

    def add(self, tokens: int) -> None:
        now = time.monotonic()
        self._recent.append((now, tokens))
        while self._recent and now - self._recent[0][0] > 30:
            self._recent.popleft()

    def per_second(self, window: float = 10.0) -> float:
        now = time.monotonic()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= window]
        if not recent:
            return 0.0
        return sum(n for _, n in recent) / max(now - recent[0][0], 1e-3)


def load_swap_drafter(engine: Engine, path: str) -> Drafter:
    """The drafter in `path`, if it fits `engine`'s target and method (`fitting_drafter`, which the swap runs
    again): checked off the engine's thread, so a misfit is refused before the swap waits for a step."""
    from adaflash.models.drafter_io import load_drafter

    drafter = load_drafter(path, engine.model.cfg)
    try:
        fitting_drafter(method_of(engine.method), drafter)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return drafter


def put_all(ready: list[tuple[Mailbox, list]]) -> None:
    """On the event loop: each mailbox its events (a step's, in one call)."""
    for target, items in ready:
        target.put_all(items)


def _take(counts: Counter, key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]


def resolve_future(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """On the event loop: a posted call's answer, unless its waiter gave up."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
