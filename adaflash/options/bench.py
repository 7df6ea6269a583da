"""The bench group: what a benchmark measures, and how."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.settings import Rule, Settings, setting

ENGINE_WARMUPS = ("auto", "short", "full", "none")


def int_list(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]; a ValueError for anything else."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError("is empty")
    return [int(item) for item in items]


@dataclass(frozen=True)
class BenchConfig(Settings):
    GROUP: ClassVar[str] = "bench"

    methods: str | None = setting(None, Rule(str, optional=True, flag="--methods",
                                             per_command=(("bench engine", "vanilla"),),
                                             help="Comma-separated methods, e.g. vanilla,dflash,adaflash; Vanilla is "
                                                  "every row's reference."))
    concurrency: str | None = setting("1", Rule(str, optional=True, flag="--concurrency", metavar="N[,N...]",
                                                per_command=(("bench shift", "4"), ("runs import", None)),
                                                help="Requests in flight at most; bench matrix: comma-separated "
                                                     "levels, e.g. 1,32,64; runs import: of every line [default: "
                                                     "max_concurrency]."))
    batch_sizes: str = setting("1", Rule(str, flag="--batch-sizes", per_command=(("bench cost", "1,8,32,64"),),
                                         help="Comma-separated batch sizes, e.g. 1,8,32."))
    warmup: str = setting("1", Rule(str, flag="--warmup", metavar="N|auto|short|full|none",
                                    per_command=(("bench engine", "auto"), ("bench cost", "3")),
                                    help="Unmeasured work first: requests (bench, bench matrix), passes per cell "
                                         "(bench cost; on a GPU the first captures its CUDA graph), or per engine "
                                         "(bench engine) short (a few tokens per slot), full (the measured requests "
                                         "once, so every CUDA graph is captured before timing), none; auto = full "
                                         "on CUDA, short elsewhere."))
    label: str | None = setting(None, Rule(str, optional=True, flag="--label",
                                           help="A name for this result (shown in comparisons)."))
    eval_accuracy: bool = setting(False, Rule(bool, flag="--eval-accuracy",
                                              help="Score answers against the references (GSM8K: last number)."))
    stream: bool = setting(True, Rule(bool, flag="--stream/--no-stream", help="Stream answers (real TTFT and ITL)."))
    ignore_eos: bool = setting(False, Rule(bool, flag="--ignore-eos", help="Always generate --max-new-tokens tokens."))
    length_spread: float = setting(0.0, Rule(float, low=0, high=1, flag="--length-spread", metavar="FRACTION",
                                             help="Each prompt's --max-new-tokens drawn from [(1 - FRACTION) x N, N] by "
                                                  "its id, the same in every method and command (SGLang's "
                                                  "--random-range-ratio is 1 - FRACTION): a synthetic target's answers, "
                                                  "which never stop on their own, then end at different steps as real "
                                                  "ones do, and rows join a batch as they would on a server."))
    api: str = setting("generate", Rule(str, choices=("generate", "openai"), flag="--api",
                                        help="The server's dialect: generate = SGLang's /generate (ours, SGLang); "
                                             "openai = /v1/completions (any OpenAI-compatible server, vLLM's too; "
                                             "τ only where the server reports it)."))
    draft_dir: str | None = setting(None, Rule(str, optional=True, flag="--draft-dir", metavar="DIR",
                                               help="A folder with one drafter per method: DIR/dflash, DIR/adaflash "
                                                    "(or adaflash-online, adaflash-init), DIR/eagle3, DIR/mtp "
                                                    "(--draft METHOD=DIR beats it)."))
    compare_hf: bool = setting(False, Rule(bool, flag="--compare-hf",
                                           help="Also time transformers' generate() on the same model folder: greedy, "
                                                "and prompt lookup at batch 1."))
    prompt_lookup_tokens: int = setting(10, Rule(int, low=1, flag="--prompt-lookup-tokens",
                                                 help="prompt_lookup_num_tokens of the hf-prompt-lookup row."))
    order: str = setting("auto", Rule(str, choices=("auto", "interleaved", "sequential"), flag="--order",
                                      help="interleaved: every method's engine gets all prompts queued and they take "
                                           "turns of a few steps, each on its own clock, so a drifting machine slows "
                                           "every row alike; sequential: one method after the other, all prompts "
                                           "queued at once; auto = interleaved on CPU, sequential on CUDA."))
    widths: str = setting("1,2,4,8,16", Rule(str, flag="--widths",
                                             help="Comma-separated tokens k verified per row in one pass (1 is a "
                                                  "Vanilla decode step)."))
    acceptance: str | None = setting(None, Rule(
        str, optional=True, flag="--acceptance", metavar="A1,A2,...",
        help="A drafter's acceptance by drafted position, as bench engine prints it. bench cost: per batch the "
             "width that maximizes tokens per second and its gain over verifying the whole block (drafts + 1 "
             "tokens, within --widths). bench engine: the drafters still run, but their tokens are the target's "
             "own (from an untimed Vanilla run) with these shares and wrong otherwise, so a synthetic target "
             "gets a real τ and AdaFlash's rule real choices; outputs stay Vanilla's."))
    context: int = setting(512, Rule(int, low=1, flag="--context", help="Tokens already in every row's cache."))
    repeats: int = setting(20, Rule(int, low=1, flag="--repeats",
                                    help="Timed passes per cell; the table shows their median."))
    bandwidth_gbs: float | None = setting(None, Rule(float, optional=True, low=0, low_open=True, flag="--bandwidth-gbs",
                                                     help="Memory bandwidth in GB/s for the Vanilla roofline "
                                                          "[default: H200 4800, H100 3350 (PCIe 2000, NVL 3900) by the "
                                                          "GPU's name; none elsewhere]."))
    phases: tuple[str, ...] = setting((), Rule(str, multiple=True, flag="--phase", metavar="NAME=DATASET[:DOMAIN]",
                                               help="A phase of traffic, in order (repeatable): prompts of a dataset, "
                                                    "or of one domain of it (`chat=suite:chat`). Requests carry the "
                                                    "phase's name as their tag."))
    seconds: str = setting("300", Rule(str, flag="--seconds", metavar="S|S1,S2,...",
                                       help="Length of each phase in seconds: one for every phase, or one per phase "
                                            "in order (60,600)."))
    holdout: int = setting(8, Rule(int, low=0, flag="--holdout",
                                   help="Prompts per phase sent only in rounds with \"adapt\": false: τ on prompts "
                                        "never trained on."))
    probe_every: float = setting(30.0, Rule(float, low=1, flag="--probe-every",
                                            help="Seconds between two rounds of held-out prompts."))
    plot: str | None = setting(None, Rule(str, optional=True, flag="--plot", metavar="FILE.svg|FILE.png",
                                          help="The picture [default: RUN_DIR/shift.svg]."))

    def check(self) -> None:
        text = self.concurrency  # the batch sizes: each command's parser names what it measures
        try:
            bad = text is not None and any(n < 1 for n in int_list(text))
        except ValueError:
            bad = True
        if bad:
            raise self.refuse("concurrency", f"must be comma-separated integers >= 1, got {text!r}")
        if self.warmup not in ENGINE_WARMUPS and not (self.warmup.isdigit()):
            raise self.refuse("warmup", f"must be an integer >= 0 or one of {', '.join(ENGINE_WARMUPS)}, "
                                        f"got {self.warmup!r}")

    @property
    def levels(self) -> list[int]:
        return int_list(self.concurrency) if self.concurrency else []

    @property
    def warmup_count(self) -> int:
        """--warmup as a count (bench, bench matrix, bench cost); a ValueError names the engine's words."""
        if not self.warmup.isdigit():
            raise self.refuse("warmup", f"must be an integer >= 0 here, got {self.warmup!r}")
        return int(self.warmup)
