"""A server that learns its own traffic (`adaflash serve --adapt`).

The on-policy pipeline with the server as its inference worker: each finished request (a sampled
share of them, minus those that opt out and those on held-out prompts) becomes a trajectory in the
swap dir, in the pipeline's format; the pipeline's training worker runs beside the server as a
supervised subprocess (`adapt_trainer`) and publishes versions; this module's thread follows the
published versions and hot-swaps each between two engine steps. Greedy answers do not change with
the drafter (the engine is lossless), only their speed does.

One thread (`adaflash-adapt`) does the slow work so neither the event loop nor the engine thread
waits on disk: it appends the recorded rows (fsync), checks the trainer, loads new versions (checksums
first), asks the engine thread to swap, applies the rollback rule (`adapt_stats`) and writes the run
log. A restart on the same swap dir serves the newest valid version from the first request.
"""

from __future__ import annotations

import array
import contextlib
import copy
import hashlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from adaflash.engine.engine import Engine
from adaflash.files import write_json_atomic
from adaflash.models.drafter_io import DrafterError, load_drafter, save_drafter
from adaflash.models.drafters import Drafter
from adaflash.pipeline.buffer import SwapBuffer
from adaflash.pipeline.presets import PRESETS
from adaflash.pipeline.training import TrainingConfig
from adaflash.pipeline.weights import WeightStore
from adaflash.runlog import RunLog
from adaflash.serve.adapt_config import AdaptConfig
from adaflash.serve.adapt_stats import VersionTally
from adaflash.serve.adapt_trainer import TrainerProcess
from adaflash.settings import SettingError
from adaflash.train.losses import LossConfig

STATE_FILE = "adapt.json"  # in the swap dir: the versions set aside, so a restart does not serve them again


class Adapter:
    """Records finished requests, supervises the trainer, follows and checks its versions."""

    def __init__(self, cfg: AdaptConfig, engine: Engine, *, target: str, draft: str, log: RunLog, run_id: str,
                 run_dir: Path) -> None:
        if engine.drafter is None:
            raise ValueError("adapting needs a method with a drafter (dflash, adaflash or osd)")
        if PRESETS[cfg.preset or "adaflash"]["length_head"] and not engine.drafter.predicts_length:
            raise SettingError("adapt", "preset", f"{cfg.preset or 'adaflash'} trains the length head, and {draft} "
                                                  "has none: give a drafter with a length head, or {preset} osd")
        self.cfg, self.engine, self.draft, self.log, self.run_id = cfg, engine, draft, log, run_id
        self.buffer, self.store = SwapBuffer(cfg.swap_dir), WeightStore(cfg.swap_dir)
        self.tally = VersionTally()
        self.rng = random.Random(cfg.seed)
        self.lock = threading.Lock()  # the tally and the pending rows (the event loop writes them)
        self.swapping = threading.Lock()  # one swap decision at a time (the adapt thread, a rollback request)
        self.pending: list[dict[str, Any]] = []
        self.rejected: set[int] = set(_read_state(Path(cfg.swap_dir)).get("rejected", []))
        self.rollbacks: list[dict[str, Any]] = []
        self.checking: list[int] = []  # the versions served since the reference, not judged yet
        # The reference (a copy): the best version accepted so far, which new ones are judged against
        # and a rollback restores; None until the next swap copies the version in use.
        self.baseline: tuple[int, Drafter] | None = None
        self.accepted: list[int] = [0]  # the versions whose requests measure the reference (its group)
        self.recorded = self.buffer.repair()
        self.dropped_at_cap = 0
        self.disk_bytes = 0
        self.capped = False
        self.train_rate: float | None = None
        self.metrics_after = 0
        self.logged_requests: dict[int, int] = {}
        self.window = [0, 0]  # tokens, verify steps of requests finished since the last run-log row
        self.held_out_window = [0, 0]  # the same, of those on held-out prompts
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="adaflash-adapt", daemon=True)
        self.run_on_engine: Callable[[Callable[[Engine], Any]], Future] | None = None
        preset = PRESETS[cfg.preset or "adaflash"]
        self.trainer = TrainerProcess(
            TrainingConfig(target=target, draft=draft, swap_dir=cfg.swap_dir, run_id=run_id, workspace=str(log.root),
                           loss=LossConfig(str(preset["loss"])), length_head=bool(preset["length_head"]), lr=cfg.lr, min_buffer=cfg.min_buffer,
                           train_batch=cfg.train_batch, publish_every=cfg.publish_every, keep=cfg.keep,
                           max_len=cfg.max_len, device="cuda" if cfg.devices else "cpu", seed=cfg.seed),
            cfg.devices, log, run_id, run_dir / "training.log")

    # -- start and stop (main thread) ------------------------------------------------------------
    def resume(self) -> None:
        """Before serving: the newest published version that passes its checksums (a restart's state)."""
        self.buffer.clear_stop()
        self.buffer.clear_done()
        self.engine.drafter_version = 0
        found, skipped = self.store.newest_valid(target=self.engine.model.cfg, skip=self.rejected)
        for version, why in skipped:
            self._event(f"skipped version {version}: {why}", level="warning")
        if found is not None:
            version, drafter = found
            self.engine.swap_drafter(drafter, version)
            self._event(f"resumed with drafter v{version} from {self.cfg.swap_dir}")
        if self.store.latest_version() in self.rejected:  # the trainer's newest state was set aside
            self._restart_trainer_from(*(found or (0, None)))

    def start(self, run_on_engine: Callable[[Callable[[Engine], Any]], Future]) -> None:
        """`run_on_engine(fn)` runs fn(engine) on the engine thread between two steps."""
        self.run_on_engine = run_on_engine
        self.trainer.start()
        self.thread.start()

    def stop(self, grace: float = 120.0) -> None:
        """Write what is pending, ask the trainer for a final version, end it."""
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(30)
        self._flush()
        self.buffer.request_stop()
        self.trainer.stop(grace)

    # -- the event loop's side -------------------------------------------------------------------
    def record(self, rid: str, prompt_ids: list[int], output_ids: list[int], text: str, meta: dict[str, Any], *,
               tag: str | None, train: bool) -> None:
        """A finished request: counted for τ, and (sampled, unless it opted out or its prompt is held out)
        kept for training."""
        version = int(meta.get("drafter_version") or 0)
        tokens, verify = int(meta.get("completion_tokens") or 0), int(meta.get("spec_verify_ct") or 0)
        held_out = not train or held_out_prompt(prompt_ids, self.cfg.holdout)
        keep = not held_out and len(output_ids) >= 2 and self.rng.random() < self.cfg.sample_rate
        with self.lock:
            self.tally.add(version, tag, tokens, verify, held_out=held_out)
            self.window[0] += tokens
            self.window[1] += verify
            if held_out:
                self.held_out_window[0] += tokens
                self.held_out_window[1] += verify
            if not keep:
                return
            if self.capped:
                self.dropped_at_cap += 1
                return
            self.pending.append({"rid": rid, "prompt_ids": list(prompt_ids), "output_ids": list(output_ids),
                                 "response": text, "finish_reason": meta.get("finish_reason"),
                                 "drafter_version": version, "tau": tokens / verify if verify else None,
                                 "completion_tokens": tokens, "spec_verify_ct": verify, "tag": tag})

    def rollback(self, to: int) -> str:
        """Serve version `to` again (0: the drafter the server started with); every version published so
        far above it is set aside and the trainer starts again from it. Blocks: call off the loop."""
        with self.swapping:
            current = self.engine.drafter_version or 0
            if to == current:
                return f"already serving v{to}"
            latest = self.store.latest_version()
            if to < 0 or to > latest:
                raise ValueError(f"'to' must be a published version between 0 and {latest}, got {to}")
            drafter = self._load(to)
            self._swap(copy.deepcopy(drafter), to)
            self._restart_trainer_from(to, drafter)  # sets aside every version above `to`
            self.checking, self.baseline, self.accepted = [], None, [to]
            message = f"rolled back from v{current} to v{to} on request"
            self.rollbacks.append({"from": current, "to": to, "why": "on request", "time": time.time()})
        self._event(message, level="warning")
        return message

    def info(self) -> dict[str, Any]:
        consumed = int((self.store.pointer() or {}).get("consumed", 0))
        with self.lock:
            versions = self.tally.as_json()
        return {
            "swap_dir": self.cfg.swap_dir, "preset": self.cfg.preset, "lr": self.cfg.lr,
            "sample_rate": self.cfg.sample_rate, "holdout": self.cfg.holdout,
            "drafter_version": self.engine.drafter_version or 0, "latest_published": self.store.latest_version(),
            "recorded": self.recorded, "consumed": consumed, "buffer_depth": max(self.recorded - consumed, 0),
            "recording": not self.capped, "dropped_at_cap": self.dropped_at_cap,
            "disk_bytes": self.disk_bytes, "max_disk_bytes": _bytes(self.cfg.max_disk_mb),
            "trainer": {**self.trainer.info(), "train_tokens_per_s": self.train_rate},
            "versions": versions, "rejected": sorted(self.rejected), "rollbacks": list(self.rollbacks),
            "rollback_rule": {"min_requests": self.cfg.rollback.min_requests, "drop": self.cfg.rollback.drop,
                              "held_out": self.cfg.rollback.held_out},
        }

    # -- the adapt thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self.stopping.wait(self.cfg.poll_seconds):
            try:
                self._tick()
            except Exception as err:  # a full disk, a locked log: say so and try again next time
                try:
                    self._event(f"adapt thread: {type(err).__name__}: {err}", level="error")
                except Exception as again:  # the run log itself: stderr only, and the thread lives on
                    print(f"adaflash serve --adapt: adapt thread: {err!r}; the run log: {again!r}",
                          file=sys.stderr, flush=True)

    def _tick(self) -> None:
        self._flush()
        note = self.trainer.check()
        if note:
            self._event(note, level="warning")
        with self.swapping:
            self._follow()
            self._judge()
        self._log_metrics()

    def _flush(self) -> None:
        with self.lock:
            rows, self.pending = self.pending, []
        if rows:
            self.recorded = self.buffer.append(rows)
        self.disk_bytes = _disk_use(Path(self.cfg.swap_dir))
        cap = _bytes(self.cfg.max_disk_mb)
        capped = cap is not None and self.disk_bytes >= cap
        if capped != self.capped:
            self.capped = capped
            self._event(f"the swap dir holds {self.disk_bytes / 1e6:.0f} MB, the cap is {self.cfg.max_disk_mb:g} MB: "
                        "recording paused (serving and swapping go on)" if capped else
                        "the swap dir is under its cap again: recording resumed", level="warning" if capped else "info")

    def _follow(self) -> None:
        """Swap to the newest published version above everything set aside.

        A version published while the one before it is still being judged replaces it at once; the rule
        then judges the versions served since the reference (`baseline`) together against it, and a
        rollback restores the reference.
        """
        latest, current = self.store.latest_version(), self.engine.drafter_version or 0
        if latest <= current or latest <= max(self.rejected, default=-1):
            return
        try:
            drafter = self._load(latest)
        except (DrafterError, ValueError, OSError) as err:
            self._reject(latest)
            self._event(f"refused version {latest}: {err}", level="warning")
            return
        first = self.baseline is None  # the version in use becomes the reference: keep a copy to come back to
        old = self._swap(drafter, latest, keep_old=first)
        if first:
            self.baseline = (current, old)
        self.checking.append(latest)
        published = (self.store.pointer() or {}).get("published_at")
        self.log.log_metrics(self.run_id, {"swapped_version": latest,
                                           "swap_lag_seconds": time.time() - float(published) if published else None},
                             version=latest, job="server")
        self._event(f"hot-swapped drafter v{latest} (was v{current})")

    def _judge(self) -> None:
        if not self.checking or self.baseline is None:
            return
        new, (old, drafter) = self.checking, self.baseline
        accepted = self.accepted if self.accepted[-1] == old else [old]
        with self.lock:
            verdict = self.cfg.rollback.verdict(self.tally, new, accepted)
        if verdict is None:
            return
        if verdict.worse:
            self._swap(copy.deepcopy(drafter), old)  # the reference stays intact for the next rollback
            self._reject(*new)
            self.rollbacks.append({"from": new[-1], "to": old, "why": verdict.why, "time": time.time()})
            self._restart_trainer_from(old, drafter)
        elif verdict.better:
            self.baseline, self.accepted = None, list(new)  # the next swap keeps a copy of the newest
        self.checking = []
        self._event(verdict.why, level="warning" if verdict.worse else "info")

    def _restart_trainer_from(self, version: int, drafter: Drafter | None) -> None:
        """After a rollback the trainer's own state is the one that went wrong: it starts again from the
        version served (`drafter`, None for v0), reading the traffic where it was (what the set-aside
        versions learned is not learned again, and nothing is lost). Every version it published since is
        set aside first. Also on a restart whose newest version was set aside."""
        self.trainer.halt()  # first: it must not publish again while the versions are set aside
        latest = self.store.latest_version()
        self._reject(*range(version + 1, latest + 1))
        draft = self.draft
        if version and drafter is not None:
            draft = str(Path(self.cfg.swap_dir) / f"reference-v{version}")
            if not Path(draft).is_dir():
                save_drafter(drafter, draft, {"version": version})
        consumed = int((self.store.pointer() or {}).get("consumed", 0))
        self.trainer.restart(replace(self.trainer.cfg, draft=draft, restart_above=latest, start_consumed=consumed))
        self._event(f"the trainer starts again from v{version} at sample {consumed}; "
                    f"versions above v{version} are set aside")

    def _log_metrics(self) -> None:
        version = self.engine.drafter_version or 0
        with self.lock:
            tokens, verify = self.window
            held_tokens, held_verify = self.held_out_window
            self.window, self.held_out_window = [0, 0], [0, 0]
            served = {v: (self.tally.requests(v), self.tally.tau(v)) for v in self.tally.served}
            tags = {tag: s.recent_tau for tag, s in self.tally.served.get(version, {}).items() if tag}
        for row in self.log.metrics_since(self.metrics_after, run_id=self.run_id,
                                          names=["train_tokens_per_s", "published_version"]):
            self.metrics_after = row["id"]
            if row["name"] == "train_tokens_per_s":
                self.train_rate = row["value"]
        if not verify:  # nothing finished since the last row
            return
        consumed = int((self.store.pointer() or {}).get("consumed", 0))
        values = {"tau": tokens / verify, "holdout_tau": held_tokens / held_verify if held_verify else None,
                  "drafter_version": version, "recorded": self.recorded,
                  "buffer_depth": max(self.recorded - consumed, 0), "swap_dir_bytes": self.disk_bytes,
                  **{f"tau@{tag}": tau for tag, tau in tags.items()}}
        self.log.log_metrics(self.run_id, values, step=self.recorded, version=version, job="server")
        for v, (n, tau) in served.items():
            if self.logged_requests.get(v) != n:
                self.logged_requests[v] = n
                self.log.log_metrics(self.run_id, {"version_requests": n, "version_tau": tau}, version=v, job="server")

    # -- helpers -----------------------------------------------------------------------------------
    def _load(self, version: int) -> Drafter:
        """Version `version` from the store (checksums first), or the starting drafter for 0."""
        cfg = self.engine.model.cfg
        if version == 0:
            return load_drafter(self.draft, cfg)
        if version not in self.store.versions():
            raise ValueError(f"version {version} is no longer on disk (kept: {self.store.versions()})")
        return self.store.load_version(version, cfg)

    def _swap(self, drafter: Drafter, version: int, *, keep_old: bool = False) -> Drafter | None:
        """Swap on the engine thread between two steps; with keep_old, a copy of the drafter it replaces."""
        assert self.run_on_engine is not None

        def swap(engine: Engine) -> Drafter | None:
            old = copy.deepcopy(engine.drafter) if keep_old else None
            engine.swap_drafter(drafter, version)
            return old

        return self.run_on_engine(swap).result(timeout=600)

    def _reject(self, *versions: int) -> None:
        """Set versions aside for good (kept in the swap dir: a restart does not serve them either)."""
        self.rejected.update(versions)
        write_json_atomic(Path(self.cfg.swap_dir) / STATE_FILE, {"rejected": sorted(self.rejected)})

    def _event(self, message: str, level: str = "info") -> None:
        print(f"adaflash serve --adapt: {message}", file=sys.stderr, flush=True)  # stdout: the ready line
        self.log.log_event(self.run_id, message, level=level, job="server")


def held_out_prompt(prompt_ids: list[int], share: float) -> bool:
    """Whether a prompt is one of the `share` never trained on: a hash of its tokens, so the same prompt
    is held out every time it comes (a held-out prompt answered once and trained on later would not be)."""
    if share <= 0.0:
        return False
    digest = hashlib.blake2b(array.array("q", prompt_ids).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < share * 2**64


def _read_state(root: Path) -> dict[str, Any]:
    try:
        state = json.loads((root / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _bytes(megabytes: float | None) -> int | None:
    return None if megabytes is None else int(megabytes * 1e6)


def _disk_use(root: Path) -> int:
    """Bytes under root; the trainer prunes and renames as we look, so what vanishes is skipped."""
    total = 0
    for folder, _, files in os.walk(root):  # os.walk skips a folder that vanished
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
    return total
