"""`adaflash bench engine`: every method through the embedded engine, side by side, in one process.

Why one process: the same loaded target, the same token ids and the same hardware for every row,
so the speed-up column divides like by like. Each (batch size, method) cell builds an engine with
`max_batch` = the batch size, runs an unmeasured warm-up generate, then submits every prompt at
once: output tok/s = completion tokens / wall time, τ = completion tokens / verify steps (the
engine's `spec_verify_ct`). The warm-up is where lazy allocation and CUDA-graph capture happen:
"short" fills every slot for a few tokens; "full" (the default on a GPU) runs the measured
requests once. On a GPU every graph the engine can meet (per batch, block and context bucket) is
captured before the warm-up, as a server does.

Order: "sequential" measures one method after the other, every prompt queued at once (continuous
batching, as a server sees them). "interleaved" builds every method's engine first, queues every
prompt on each, and lets them take turns of a few steps, each engine timed on its own clock (its
latencies too), so a machine whose speed drifts (a laptop's clock, a shared CPU: ±20% within minutes
here) slows every row alike and the speed-up column stays a like-for-like ratio, with the same
continuous batching as sequential order. (Turns over static groups of `batch` prompts would make a
speculative batch wait for its slowest row, and understate its speed-up.) "auto" picks interleaved on a CPU and sequential on a GPU, whose speed
holds still and whose engines are big.

Greedy only, so every row can be checked token for token against our Vanilla row of the same batch
size (`identical`, `mismatches`); the Vanilla rows themselves are checked against Vanilla at the
smallest batch size (batching must not change greedy output either). With `compare_hf`, transformers'
own `generate()` runs on the same model folder and token ids: plain greedy at every batch size
(static batches, left padding) and prompt-lookup assisted generation at batch 1 (HF allows no more).

All rows go to one run of kind "bench-matrix" (each record carries `matrix_run`), so
`adaflash runs compare RUN` (or plain `runs compare` right after) shows them with speed-ups.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adaflash.bench.compare import overall_records
from adaflash.bench.engine_spec import EngineBenchError, EngineBenchSpec
from adaflash.bench.engine_table import HF_GENERATE, HF_PROMPT_LOOKUP
from adaflash.bench.hf_generate import hf_generate
from adaflash.bench.metrics import (
    TokenGaps,
    accuracy,
    compute_metrics,
    engine_results,
    passes_since,
    passes_text,
)
from adaflash.bench.prompts import BenchPrompt, answer_budget, domains_of
from adaflash.engine.params import DRAFT_MARGIN
from adaflash.methods import VANILLA, method_of

WARMUP_TOKENS = 8  # at most; never more than half of max_new_tokens (prefill + a few decode/verify steps)


@dataclass
class EngineBenchEvents:
    """Callbacks for progress display; all optional."""

    message: Callable[[str], None] | None = None
    row: Callable[[dict[str, Any]], None] | None = None


def _passes(engine: Any, before: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float]]:
    return passes_since(engine.pass_totals(), before)


def _warmup_tokens(max_new_tokens: int) -> int:
    return min(WARMUP_TOKENS, max(2, max_new_tokens // 2))


TURN_STEPS = 8  # engine steps per turn in interleaved order: a few ms on a GPU, so drift hits every method alike


class TurnClock:
    """An engine's own time, running only during its turns: its requests' latencies and its throughput
    are what they would be alone on the machine, while engines take turns."""

    def __init__(self) -> None:
        self.total = 0.0
        self._since: float | None = None

    def __call__(self) -> float:
        return self.total + (time.perf_counter() - self._since if self._since is not None else 0.0)

    def start(self) -> None:
        self._since = time.perf_counter()

    def stop(self) -> None:
        self.total, self._since = self(), None


def _sync(device: Any) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: Any) -> None:
    gc.collect()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def hardware_of(device: Any) -> str:
    import torch

    text = str(device)
    if text.startswith("cuda") and torch.cuda.is_available():
        return f"{text} ({torch.cuda.get_device_name(torch.device(text))})"
    return text


def _mismatches(outputs: list[list[int]], reference: list[list[int]] | None, ids: list[str]) -> tuple[int | None, list[str]]:
    if reference is None:
        return None, []
    bad = [pid for pid, mine, ref in zip(ids, outputs, reference) if mine != ref]
    return len(bad), bad


def _hf_summary(completion: list[int], prompt_tokens: list[int], duration: float, steps: int) -> dict[str, Any]:
    """transformers' rows: `generate()` runs a batch as one call, so there are no per-request times or
    verify counts, only the batch's tokens and its target forwards."""
    out_tokens, in_tokens = sum(completion), sum(prompt_tokens)
    return {
        "completed": len(completion), "duration": duration, "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens, "request_throughput": len(completion) / duration,
        "output_throughput": out_tokens / duration, "total_throughput": (in_tokens + out_tokens) / duration,
        "accept_length": out_tokens / steps if steps else None, "spec_verify_ct": steps,
    }


class EngineBench:
    """One run of the engine benchmark: load the target once, then measure every cell."""

    def __init__(self, spec: EngineBenchSpec, prompts: list[BenchPrompt], log: Any,
                 events: EngineBenchEvents | None = None) -> None:
        if not prompts:
            raise EngineBenchError("no prompts to measure")
        self.spec = spec
        self.prompts = prompts
        self.log = log
        self.events = events or EngineBenchEvents()
        self.records: list[dict[str, Any]] = []
        self.run_id: str | None = None
        self._hf_model: Any = None
        self.domains = domains_of(prompts)
        self.dataset = spec.dataset  # per domain while a suite's domain is measured: "suite/code"
        # A suite's engines, one per (method, batch), built and warmed once for every domain: CUDA-graph
        # capture takes a while per speculative engine, and would be paid once per domain otherwise.
        self._engines: dict[tuple[str, int], Any] | None = None
        self._references: dict[tuple[int, ...], list[int]] | None = None  # scripted acceptance's answers

    def say(self, message: str) -> None:
        if self.events.message:
            self.events.message(message)
        if self.run_id:
            self.log.log_event(self.run_id, message)

    # -- setup ---------------------------------------------------------------------------------
    def load(self) -> None:
        from adaflash.engine.build import build_engine
        from adaflash.models.drafter_io import DrafterError
        from adaflash.models.kernels import kernels_on
        from adaflash.models.loading import load_target

        spec = self.spec
        try:
            self.target = load_target(spec.target, device=spec.device, dtype=spec.dtype)
        except (OSError, ValueError, RuntimeError, AssertionError) as err:  # no CUDA build → AssertionError
            raise EngineBenchError(f"--target {spec.target} on --device {spec.device or 'auto'}: cannot load it "
                                   f"({err})") from None
        self.ids = [self.target.encode(p.text) for p in self.prompts]
        if any(not ids for ids in self.ids):
            raise EngineBenchError("a prompt renders to no tokens; check the prompt file")
        self.max_len = max(len(ids) for ids in self.ids) + spec.max_new_tokens + DRAFT_MARGIN
        self.hardware = hardware_of(self.target.device)
        self.kernels = kernels_on(self.target.device)
        self.warmup = spec.warmup
        if self.warmup == "auto":
            self.warmup = "full" if str(self.target.device).startswith("cuda") else "short"
        if self.warmup not in ("short", "full", "none"):
            raise EngineBenchError(f"--warmup must be auto, short, full or none, got {spec.warmup!r}")
        self.order = spec.order
        if self.order == "auto":
            self.order = "sequential" if str(self.target.device).startswith("cuda") else "interleaved"
        if self.order not in ("interleaved", "sequential"):
            raise EngineBenchError(f"--order must be auto, interleaved or sequential, got {spec.order!r}")
        # Build every speculative engine once at batch 1 before measuring anything, so a drafter
        # that does not fit the target (or the method) fails in seconds, not after the first rows.
        for method in spec.methods:
            if not method_of(method).needs_drafter:
                continue
            try:
                build_engine(self.target, method, spec.drafts[method],
                             config=spec.engine_config.replace(max_batch=1, max_len=self.max_len))
            except (DrafterError, ValueError) as err:
                raise EngineBenchError(f"--draft {method}={spec.drafts[method]}: {err}") from None
        _free(self.target.device)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> str:
        """Measure everything; returns the run id (rows are recorded as they come)."""
        spec = self.spec
        self.load()
        self.run_id = self.log.create_run(
            "bench-matrix", name=spec.label or f"bench-engine-{spec.dataset}", target=spec.target,
            dataset=spec.dataset, config={**spec.config(), "num_prompts": len(self.prompts),
                                          "hardware": self.hardware, "max_len": self.max_len,
                                          "warmup": self.warmup, "order": self.order})
        expected = len(spec.methods) * len(spec.batch_sizes)
        if spec.compare_hf:
            expected += len(spec.batch_sizes) + (1 if 1 in spec.batch_sizes else 0)
        expected *= max(1, len(self.domains))
        import torch

        try:
            self._run_domains()
        except torch.OutOfMemoryError as err:
            self.log.finish_run(self.run_id, "failed", note=f"out of memory after {len(self.records)} results")
            raise EngineBenchError(f"out of memory after {len(self.records)} result(s) ({str(err).splitlines()[0]}); "
                                   "lower --batch-sizes or --max-new-tokens") from None
        except BaseException as err:
            self.log.finish_run(self.run_id, "stopped" if isinstance(err, KeyboardInterrupt) else "failed",
                                note=f"{type(err).__name__}: {err}")
            raise
        finally:
            self._hf_model = None
            _free(self.target.device)
        lossy = [f"{r['method']}@b{r['concurrency']}" for r in self.records if r.get("mismatches")]
        note = f"{len(self.records)}/{expected} results" + (f"; greedy mismatches: {', '.join(lossy)}" if lossy else "")
        self.log.finish_run(self.run_id, "finished", note=note)
        return self.run_id

    def _run_domains(self) -> None:
        """Every cell once, or once per domain of a suite (then an overall row per method and batch)."""
        if not self.domains:
            self._run_cells()
            return
        everything, all_ids = self.prompts, self.ids
        self._engines = {}
        for domain in self.domains:
            keep = [i for i, p in enumerate(everything) if p.domain == domain]
            self.prompts, self.ids = [everything[i] for i in keep], [all_ids[i] for i in keep]
            self.dataset = f"{self.spec.dataset}/{domain}"
            self.say(f"domain {domain}: {len(keep)} prompts")
            self._run_cells()
        self.prompts, self.ids, self.dataset = everything, all_ids, self.spec.dataset
        self._engines = None
        _free(self.target.device)
        for record in overall_records(self.records, self.spec.dataset, self.domains):
            self.log.add_bench_result(self.run_id, record)
            self.records.append(record)
            speedup = f"speed-up {record['speedup']:.2f}x, " if record.get("speedup") else ""
            tau = f"τ {record['accept_length']:.2f} " if record.get("accept_length") else ""
            self.say(f"{record['method']} @ batch {record['concurrency']} over the suite: {speedup}{tau}"
                     f"(means over {len(self.domains)} domains)")

    def _run_cells(self) -> None:
        spec = self.spec
        first_vanilla: list[list[int]] | None = None
        for batch in spec.batch_sizes:
            if batch > len(self.prompts):
                self.say(f"note: batch {batch} with {len(self.prompts)} prompts: at most {len(self.prompts)} "
                         "run at once")
            measured = self._interleaved(batch) if self.order == "interleaved" else None
            vanilla: list[list[int]] | None = None
            for method in spec.methods:
                reference = first_vanilla if method == VANILLA else vanilla
                name = f"{VANILLA}@b{spec.batch_sizes[0]}" if method == VANILLA else f"{VANILLA}@b{batch}"
                if measured is not None:
                    outputs, duration, gaps, passes = measured[method]
                else:
                    engine = self._ready_engine(method, batch)
                    outputs, duration, gaps, passes = self._timed(engine, list(range(len(self.prompts))))
                    self._say_costs(engine, method, batch)
                    self._profile(engine, method, batch)
                    del engine
                    _free(self.target.device)
                ids = [list(o.output_ids) for o in outputs]
                metrics = {**self._metrics(outputs, duration, gaps), "passes": passes}
                self._record(method, batch, metrics, ids, reference, name, "embedded")
                if method == VANILLA:
                    vanilla = ids
                    if first_vanilla is None:
                        first_vanilla = ids
            if spec.compare_hf:
                self._hf_cell(HF_GENERATE, batch, vanilla)
                if batch == 1:
                    self._hf_cell(HF_PROMPT_LOOKUP, 1, vanilla)
        if spec.compare_hf and 1 not in spec.batch_sizes:
            self.say(f"note: {HF_PROMPT_LOOKUP} runs at batch 1 only (transformers' assisted generation allows "
                     "no more); add 1 to --batch-sizes to measure it")

    def _interleaved(self, batch: int) -> dict[str, tuple[list[Any], float, dict[str, list[float]], dict[str, Any]]]:
        """Every method's (outputs in prompt order, its own engine seconds, inter-token gaps per request, passes): each engine
        has every prompt queued and they take turns of `TURN_STEPS` steps, each timed on its own
        `TurnClock`."""
        methods = self.spec.methods
        engines = {method: self._ready_engine(method, batch) for method in methods}
        everyone = list(range(len(self.prompts)))
        requests = {method: self._requests(everyone) for method in methods}
        clocks = {method: TurnClock() for method in methods}
        gaps = {method: TokenGaps(clocks[method]) for method in methods}
        done: dict[str, dict[str, Any]] = {method: {} for method in methods}
        before = {method: _passes(engine) for method, engine in engines.items()}
        for method, engine in engines.items():
            engine.clock = clocks[method]  # after the warm-up: its requests are off this clock
            for request in requests[method]:
                engine.add(request)
        answered, turn = 0, 0
        while any(engine.has_work() for engine in engines.values()):
            shift = turn % len(methods)
            for method in methods[shift:] + methods[:shift]:
                self._turn(engines[method], clocks[method], done[method], gaps[method])
            turn += 1
            # progress for displays (a recipe's step bar): prompts every method has answered
            if (now := min(len(finished) for finished in done.values())) > answered:
                answered = now
                self.log.log_metrics(self.run_id, {"prompts_done": answered}, step=answered)
        passes = {method: _passes(engine, before[method]) for method, engine in engines.items()}
        for method, engine in engines.items():
            self._say_costs(engine, method, batch)
            self._profile(engine, method, batch)
        del engines
        _free(self.target.device)
        return {method: ([done[method][r.rid] for r in requests[method]], clocks[method].total, gaps[method].itl,
                         passes[method]) for method in methods}

    def _turn(self, engine: Any, clock: TurnClock, done: dict[str, Any], gaps: TokenGaps) -> None:
        """Up to TURN_STEPS engine steps on the engine's own clock; finished outputs go to `done`."""
        if not engine.has_work():
            return
        _sync(self.target.device)
        clock.start()
        for _ in range(TURN_STEPS):
            for event in engine.step():
                gaps(event)
                if event.output is not None:
                    done[event.rid] = event.output
            if not engine.has_work():
                break
        _sync(self.target.device)
        clock.stop()

    def _say_costs(self, engine: Any, method: str, batch: int) -> None:
        """AdaFlash's cost rule: the median step time it measured for each verify width, by batch bucket,
        the table its choices came from (warm-up steps included)."""
        rule = getattr(engine, "cost_rule", None)
        if rule is None:
            return
        for bucket in sorted({key[0] for key in rule.samples}, reverse=True):
            table = rule.cost(bucket)
            if table:
                widths = ", ".join(f"{width}: {seconds * 1e3:.2f}" for width, seconds in table.items())
                self.say(f"{method}@b{batch}: ms a step by verify width at batch {bucket} (cost rule): {widths}")

    def _profile(self, engine: Any, method: str, batch: int) -> None:
        """With `--profile DIR`: the engine's steps, kernel by kernel, after its measured run (off the clock)."""
        if not self.spec.profile:
            return
        from adaflash.bench.profiling import profile_engine

        name = f"{self.run_id}-{method}-b{batch}"
        engine.clock = time.perf_counter  # a turn clock stands still once its run is over: steps would take 0 s
        try:
            done = profile_engine(engine, self._requests(list(range(len(self.prompts)))), Path(self.spec.profile),
                                  name, steps=self.spec.profile_steps, warm_steps=self.spec.profile_steps,
                                  on_cuda=str(self.target.device).startswith("cuda"))
        except (OSError, ValueError) as err:
            raise EngineBenchError(f"--profile {self.spec.profile}: {err}") from None
        self.say(f"{method} @ batch {batch}: profiled {done.steps} steps -> {done.table} (trace {done.trace.name}); "
                 f"the prefill of {done.admitted} prompts -> {done.prefill_table}")

    def _record(self, method: str, batch: int, metrics: dict[str, Any], outputs: list[list[int]],
                reference: list[list[int]] | None, reference_name: str | None, backend: str) -> dict[str, Any]:
        spec = self.spec
        ids = [p.id for p in self.prompts]
        count, bad = _mismatches(outputs, reference, ids)
        record = {
            **metrics, "method": method, "target": spec.target, "draft": spec.drafts.get(method),
            "dataset": self.dataset, "domain": self.prompts[0].domain, "label": spec.label, "concurrency": batch, "max_concurrency": batch,
            "batch_size": batch, "num_prompts": len(self.prompts), "max_new_tokens": spec.max_new_tokens, "length_spread": spec.length_spread,
            "temperature": 0.0, "top_p": 1.0, "hardware": self.hardware, "backend": backend,
            "dtype": str(self.target.model.dtype).removeprefix("torch."), "matrix_run": self.run_id,
            "identical": None if count is None else count == 0, "mismatches": count, "mismatched_ids": bad[:10],
            "identical_reference": reference_name if reference is not None else None, "warmup": self.warmup,
            "order": self.order if backend == "embedded" else "sequential",
            "kernels": self.kernels if backend == "embedded" else None,
            "acceptance_script": spec.acceptance if backend == "embedded" and method_of(method).needs_drafter else None,
            "accuracy": accuracy(self.dataset, [(self.target.decode(out), p.reference)
                                                for out, p in zip(outputs, self.prompts)]),
        }
        self.log.add_bench_result(self.run_id, record)
        self.records.append(record)
        tau = record.get("accept_length")
        self.say(f"{method} @ batch {batch}: {record['output_throughput']:.1f} tok/s"
                 + (f", τ {tau:.2f}" if tau else "")
                 + ("" if count is None else f", identical to {reference_name}: "
                    + ("yes" if count == 0 else f"no ({count}/{len(outputs)} prompts differ)"))
                 + (f"; passes: {passes_text(record['passes'])}" if record.get("passes") else ""))
        if self.events.row:
            self.events.row(record)
        return record

    def _ready_engine(self, method: str, batch: int) -> Any:
        """The method's engine at this batch size, warmed up (allocation, CUDA-graph capture) off the clock."""
        from adaflash.engine.build import build_engine
        from adaflash.engine.params import Request, SamplingParams

        spec = self.spec
        if self._engines is not None and (method, batch) in self._engines:
            return self._engines[(method, batch)]
        engine = build_engine(self.target, method, spec.drafts.get(method),
                              config=spec.engine_config.replace(max_batch=batch, max_len=self.max_len))
        if spec.acceptance and engine.drafter is not None:
            self._script(engine, batch)
        if self.warmup != "none" and engine.graphs.enabled:
            # Every graph the run can meet, as `serve` and `eval` capture them: a warm-up replays the
            # timed run's shapes, but not the rare widths AdaFlash's cost rule re-times, whose captures
            # would then land on the clock, a visible share of a short timed run.
            started = time.perf_counter()
            count = engine.capture_graphs(self.max_len)
            self.say(f"{method} @ batch {batch}: captured {count} CUDA graphs in {time.perf_counter() - started:.1f} s")
        if self.warmup == "full":
            engine.generate(self._requests(list(range(len(self.prompts)))))
        elif self.warmup == "short":
            warm_params = SamplingParams(max_new_tokens=_warmup_tokens(spec.max_new_tokens))
            engine.generate([Request(list(self.ids[i % len(self.ids)]), warm_params) for i in range(batch)])
        if self._engines is not None:
            self._engines[(method, batch)] = engine
        return engine

    def _script(self, engine: Any, batch: int) -> None:
        """Make the engine's drafts follow --acceptance, against Vanilla's answers to every prompt (one
        untimed Vanilla run, the first time)."""
        from adaflash.engine.build import build_engine
        from adaflash.engine.scripted import ScriptedAcceptance

        if self._references is None:
            self.say("scripted acceptance: Vanilla answers every prompt first (untimed)")
            vanilla = build_engine(self.target, config=self.spec.engine_config.replace(
                max_batch=max(self.spec.batch_sizes), max_len=self.max_len))
            outputs = vanilla.generate(self._requests(list(range(len(self.prompts)))))
            self._references = {tuple(ids): list(ids) + out.output_ids for ids, out in zip(self.ids, outputs)}
            del vanilla
        try:
            engine.script = ScriptedAcceptance(self.spec.acceptance or [], self._references, slots=batch + 1,
                                               width=self.max_len + engine.drafter.max_draft + 2,
                                               vocab=self.target.model.cfg.vocab_size, device=engine.device)
        except ValueError as err:
            raise EngineBenchError(f"--acceptance: {err}") from None

    def _requests(self, indices: list[int]) -> list[Any]:
        from adaflash.engine.params import Request, SamplingParams

        spec = self.spec
        budgets = [answer_budget(self.prompts[i].id, spec.max_new_tokens, spec.length_spread) for i in indices]
        return [Request(list(self.ids[i]), SamplingParams(max_new_tokens=budget, temperature=0.0),
                        prompt_text=self.prompts[i].text) for i, budget in zip(indices, budgets)]

    def _timed(self, engine: Any, indices: list[int]) -> tuple[list[Any], float, dict[str, list[float]], dict[str, Any]]:
        """The prompts at `indices`, all queued at once: (outputs in that order, wall seconds, inter-token
        gaps per request, the engine's passes by kind)."""
        gaps = TokenGaps(time.perf_counter)
        before = _passes(engine)
        _sync(self.target.device)
        started = time.perf_counter()
        outputs = engine.generate(self._requests(indices), on_event=gaps)
        _sync(self.target.device)
        return outputs, time.perf_counter() - started, gaps.itl, _passes(engine, before)

    def _metrics(self, outputs: list[Any], duration: float, itl: dict[str, list[float]]) -> dict[str, Any]:
        # Every prompt is queued at once, so TTFT includes waiting for a free slot (as in bench_serving).
        return compute_metrics(engine_results(outputs, itl), duration)

    # -- transformers ----------------------------------------------------------------------------
    def _hf(self) -> Any:
        if self._hf_model is None:
            from transformers import AutoModelForCausalLM

            self.say(f"loading {self.target.folder} with transformers for --compare-hf")
            model = AutoModelForCausalLM.from_pretrained(str(self.target.folder), dtype=self.target.model.dtype)
            self._hf_model = model.to(self.target.device).eval()
        return self._hf_model

    def _hf_cell(self, method: str, batch: int, reference: list[list[int]] | None) -> None:
        spec = self.spec
        model = self._hf()
        lookup = spec.prompt_lookup_tokens if method == HF_PROMPT_LOOKUP else None
        if self.warmup != "none":  # transformers captures nothing: a short pass initializes kernels
            warm = [self.ids[i % len(self.ids)] for i in range(min(batch, len(self.ids)))]
            hf_generate(model, self.target, warm, _warmup_tokens(spec.max_new_tokens), lookup, [0])
        outputs: list[list[int]] = []
        steps = 0
        _sync(self.target.device)
        started = time.perf_counter()
        for at in range(0, len(self.ids), batch):
            calls = [0]
            outputs += hf_generate(model, self.target, self.ids[at: at + batch], spec.max_new_tokens, lookup, calls)
            steps += calls[0]
        _sync(self.target.device)
        duration = time.perf_counter() - started
        completion = [len(o) for o in outputs]
        # τ = tokens per target forward: exact at batch 1 (prompt lookup runs there only); plain greedy is 1.
        tau_steps = steps if lookup else sum(completion)
        metrics = _hf_summary(completion, [len(ids) for ids in self.ids], duration, tau_steps)
        metrics["accept_rate"] = None
        if lookup:
            metrics["prompt_lookup_num_tokens"] = lookup
        self._record(method, batch, metrics, outputs, reference, f"{VANILLA}@b{batch}" if reference else None,
                     "transformers")


def run_engine_bench(spec: EngineBenchSpec, prompts: list[BenchPrompt], log: Any,
                     events: EngineBenchEvents | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(run id, records): every method × batch size (and transformers' rows with compare_hf)."""
    bench = EngineBench(spec, prompts, log, events)
    run_id = bench.run()
    return run_id, bench.records
