"""`python -m sglang.launch_server` command lines for every method, built without importing SGLang.

SGLang is the production engine on GPU clusters; here it is only a subprocess with the exact flags
each method needs. The flag names come from SGLang's server arguments as used by its DFlash support
(`--speculative-algorithm DFLASH --speculative-draft-model-path D --speculative-dflash-block-size B`),
its EAGLE-3 / NEXTN (MTP) speculative options, and, for AdaFlash's length head, from the SGLang branch
the AdaFlash seed serves with (see ADAFLASH_FLAGS). Per-model extras live in MODEL_PROFILES so a new
model is one table row, not a new script.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from adaflash.devices import child_devices
from adaflash.methods import method_of

# The length-head flags (methods whose table row says `length_head`). Source: the AdaFlash seed's serving script
# (github.com/ZinYY/AdaFlash, scripts/serve/serve_thresh_head.sh), which runs the SGLang branch of
# pull request sgl-project/sglang#34171 ("Add AdaFlash adaptive verification for DFlash"). The PR text
# names the head (ThreshHeadTwoModel, `dflash_config.thresh_head_direct_len`) but its CLI names could
# not be read in full, so every name is kept here, in one table: a rename upstream is one line.
ADAFLASH_FLAGS = {
    "dynamic_verify": "--dflash-dynamic-verify-len",        # switch the length head on
    "ema_alpha": "--dflash-dynamic-verify-ema-alpha",       # smoothing of the verify length
    "hard_clip_scale": "--dflash-hard-clip-scale",          # Qwen3.5 hybrid models: clip layout
    "length_rate": "--thresh-head-threshold-rate",          # scale on the predicted length (our --length-rate)
    "min_length": "--prob-head-candidate-len-min",          # fewest positions verified (our --min-length)
}
ADAFLASH_DEFAULTS = {"ema_alpha": 0.3, "hard_clip_scale": 1.0}
# The seed's script notes the head is ignored unless SGLang's max_running_requests is above 48.
ADAFLASH_MIN_RUNNING_REQUESTS = 49
ADAFLASH_DEFAULT_RUNNING_REQUESTS = 64

COMMON_ARGS = ("--dtype", "bfloat16", "--attention-backend", "fa3", "--mem-fraction-static", "0.80",
               "--trust-remote-code", "--skip-server-warmup")


@dataclass(frozen=True)
class ModelProfile:
    """Extras one model family needs; matched by a lowercase substring of the target id."""

    name: str
    match: tuple[str, ...]
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    method_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    method_env: dict[str, dict[str, str]] = field(default_factory=dict)
    eagle: tuple[int, int, int] = (5, 4, 16)      # speculative num-steps, eagle-topk, num-draft-tokens
    mtp: tuple[int, int, int] = (3, 1, 4)


MODEL_PROFILES: tuple[ModelProfile, ...] = (
    ModelProfile(
        "qwen3.5", ("qwen3.5",),
        args=("--mamba-scheduler-strategy", "extra_buffer"),
        env={"SGLANG_DISABLE_CUDNN_CHECK": "1"},
        method_args={"mtp": ("--reasoning-parser", "qwen3")},
        method_env={"dflash": {"SGLANG_ENABLE_SPEC_V2": "1"}, "osd": {"SGLANG_ENABLE_SPEC_V2": "1"}},
    ),
    ModelProfile("qwen3-coder", ("qwen3-coder",), env={"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}),
    ModelProfile("qwen3", ("qwen3",), eagle=(6, 10, 32)),
    ModelProfile("default", ("",)),
)


@dataclass
class SGLangCommand:
    argv: list[str]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        """What a person would type: env assignments, then the quoted argv."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (prefix + " " if prefix else "") + shlex.join(self.argv)


def profile_for(target: str) -> ModelProfile:
    lowered = target.lower()
    for profile in MODEL_PROFILES:
        if any(m in lowered for m in profile.match):
            return profile
    return MODEL_PROFILES[-1]


def sglang_model_path(target: str) -> str:
    """A built-in name becomes its hub id (SGLang loads the real checkpoint); anything else passes."""
    from adaflash.models.registry import BUILTINS

    if target in BUILTINS:
        return BUILTINS[target].hub_id
    path = Path(target).expanduser()
    return str(path.resolve()) if path.exists() else target


def draft_block_size(draft: str | None) -> int | None:
    """The block size a local DFlash drafter folder declares; None when unknown (SGLang reads it)."""
    if not draft:
        return None
    config = Path(draft).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        cfg = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    value = (cfg.get("dflash_config") or {}).get("block_size", cfg.get("block_size"))
    return int(value) if isinstance(value, int) else None


def build_sglang_command(
    method: str,
    target: str,
    draft: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
    gpus: str | None = None,
    api_key: str | None = None,
    max_batch: int | None = None,
    length_rate: float = 1.0,
    min_length: int = 2,
    steps: int | None = None,
    block_size: int | None = None,
    extra_args: list[str] | tuple[str, ...] = (),
    python: str | None = None,
) -> SGLangCommand:
    """The argv and environment that launch SGLang for `method` on `target` (raises ValueError)."""
    spec = method_of(method)
    if spec.needs_draft_on("sglang") and not draft:
        raise ValueError(f"--method {method} with --engine sglang needs --draft (a drafter folder or hub id)")
    gpu_ids = child_devices(gpus, "--gpus") if gpus is not None else None
    if gpus is not None and gpu_ids is None:
        raise ValueError("SGLang runs on GPUs only: give --gpus 0[,1,...] (or use --engine embedded on CPU)")
    profile = profile_for(target)
    notes: list[str] = []
    argv = [python or sys.executable, "-m", "sglang.launch_server",
            "--model-path", sglang_model_path(target), "--host", host, "--port", str(port),
            "--tp-size", str(len(gpu_ids) if gpu_ids else 1)]
    argv += COMMON_ARGS
    argv += profile.args
    env = dict(profile.env)
    env.update(profile.method_env.get(method, {}))
    if gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    algorithm = spec.sglang_algorithm
    if algorithm == "DFLASH":
        argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(draft)]
        block = block_size or draft_block_size(draft)
        if block:
            argv += ["--speculative-dflash-block-size", str(block)]
        if spec.length_head:
            argv += [ADAFLASH_FLAGS["dynamic_verify"],
                     ADAFLASH_FLAGS["ema_alpha"], str(ADAFLASH_DEFAULTS["ema_alpha"]),
                     ADAFLASH_FLAGS["hard_clip_scale"], str(ADAFLASH_DEFAULTS["hard_clip_scale"]),
                     ADAFLASH_FLAGS["length_rate"], str(length_rate),
                     ADAFLASH_FLAGS["min_length"], str(min_length)]
            if max_batch is None:
                max_batch = ADAFLASH_DEFAULT_RUNNING_REQUESTS
            elif max_batch < ADAFLASH_MIN_RUNNING_REQUESTS:
                notes.append(f"--max-batch {max_batch} ≤ 48: this SGLang branch then ignores the length head "
                             "and runs plain DFlash")
    elif algorithm == "EAGLE3":
        num_steps, topk, draft_tokens = profile.eagle
        argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft),
                 "--speculative-num-steps", str(steps or num_steps), "--speculative-eagle-topk", str(topk),
                 "--speculative-num-draft-tokens", str(draft_tokens)]
    elif algorithm == "NEXTN":
        num_steps, topk, draft_tokens = profile.mtp
        argv += ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(steps or num_steps),
                 "--speculative-eagle-topk", str(topk), "--speculative-num-draft-tokens", str(draft_tokens)]
        if draft:
            argv += ["--speculative-draft-model-path", str(draft)]
        if profile.name != "qwen3.5":
            notes.append("NEXTN uses the target's own MTP layers (native in Qwen3.5); other targets need an "
                         "SGLang-loadable MTP draft")
    argv += profile.method_args.get(method, ())
    if max_batch is not None:
        argv += ["--max-running-requests", str(max_batch)]
    if api_key:
        argv += ["--api-key", api_key]
    for extra in extra_args:
        argv += shlex.split(extra)
    return SGLangCommand(argv, env, notes)
