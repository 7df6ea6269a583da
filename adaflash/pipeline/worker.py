"""Worker entry points (`python -m adaflash.pipeline.worker infer|train ARGS_JSON`), started by the launcher.

Arguments travel as one JSON object (the dataclass fields) so the launcher and the workers
cannot disagree on flag spellings.
"""

from __future__ import annotations

import json
import signal
import sys

from adaflash.pipeline.buffer import SwapBuffer


def _stop_on_signal(swap_dir: str) -> None:
    """SIGTERM/SIGINT become a stop request: the worker finishes its step and exits cleanly."""

    def handler(_signum, _frame) -> None:
        SwapBuffer(swap_dir).request_stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("infer", "train"):
        print("usage: python -m adaflash.pipeline.worker infer|train ARGS_JSON", file=sys.stderr)
        return 2
    role, raw = argv
    args = json.loads(raw)
    _stop_on_signal(args["swap_dir"])
    if role == "infer":
        from adaflash.pipeline.inference import InferenceConfig, run_inference

        produced = run_inference(InferenceConfig.from_json(args))
        print(f"adaflash inference worker finished: {produced} trajectories", flush=True)
    else:
        from adaflash.pipeline.training import TrainingConfig, run_training

        consumed = run_training(TrainingConfig.from_json(args))
        print(f"adaflash training worker finished: {consumed} samples consumed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
