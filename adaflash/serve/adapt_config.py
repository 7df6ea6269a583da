"""`serve --adapt`'s settings: one group that the options fill, the run log records and the `Adapter` runs
on, checked once when it is built (`for_server` adds the checks against the server's method and engine).

Torch-free, so `adaflash serve --help` lists the options without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from adaflash.methods import ADAFLASH, ONLINE_TRAINABLE, OSD, method_of
from adaflash.options.pipeline import SWAP_DIR, TRAIN_GPUS
from adaflash.pipeline.presets import PRESETS
from adaflash.serve.adapt_stats import RollbackRule
from adaflash.settings import Rule, SettingError, Settings, setting


@dataclass(frozen=True)
class AdaptConfig(Settings):
    """A server that learns its own traffic. Code that builds one adapts; `serve` does with --adapt only
    (`enabled` False leaves every other field unused)."""

    GROUP: ClassVar[str] = "adapt"

    enabled: bool = setting(True, Rule(bool, flag="--adapt", per_command=(("serve", False),),
                                        help="Learn the traffic: record finished requests, train the drafter beside "
                                             "the server, hot-swap each version it publishes (dflash, adaflash, osd; "
                                             "embedded engine)."))
    swap_dir: str | None = setting(None, SWAP_DIR)
    sample_rate: float = setting(1.0, Rule(float, low=0, high=1, flag="--adapt-sample",
                                           help="--adapt: share of finished requests recorded for training."))
    holdout: float = setting(0.05, Rule(float, low=0, high=1, high_open=True, flag="--adapt-holdout",
                                        help="--adapt: share of prompts (by a hash of their tokens) never trained on; "
                                             "the rollback rule judges each version by its τ on them (0: on all "
                                             "traffic)."))
    preset: str | None = setting(None, Rule(str, optional=True, choices=tuple(sorted(PRESETS)), flag="--adapt-preset",
                                            help="--adapt: the trainer's loss: adaflash = reverse-KL mixture + length "
                                                 "head, osd = forward KL [default: osd for --method osd, else "
                                                 "adaflash]."))
    train_gpus: str = setting("cpu", TRAIN_GPUS)
    max_disk_mb: float | None = setting(2048.0, Rule(float, optional=True, low=0, low_open=True, flag="--adapt-max-disk",
                                                     metavar="MB",
                                                     help="--adapt: recording pauses while the swap dir holds this "
                                                          "much (serving goes on)."))
    train_batch: int = setting(8, Rule(int, low=1, flag="--adapt-train-batch",
                                       help="--adapt: recorded requests per training step."))
    publish_every: int = setting(4, Rule(int, low=1, flag="--adapt-publish-every",
                                         help="--adapt: training steps per published version."))
    lr: float = setting(1e-4, Rule(float, low=0, low_open=True, flag="--adapt-lr",
                                   help="--adapt: the trainer's learning rate (higher follows a shift faster, and "
                                        "forgets faster)."))
    rollback_min_requests: int = setting(32, Rule(int, low=1, flag="--rollback-min-requests",
                                                  help="--adapt: requests the versions since the reference serve (on "
                                                       "held-out prompts, see --adapt-holdout) before their τ is "
                                                       "compared with the reference's."))
    rollback_drop: float = setting(0.1, Rule(float, low=0, high=1, flag="--rollback-drop",
                                             help="--adapt: roll a version back when its τ is lower than the "
                                                  "reference's (the best version accepted so far) by more than this "
                                                  "fraction (docs/http-api.md)."))
    rollback_to: int | None = setting(None, Rule(int, optional=True, low=0, flag="--to",
                                                 help="The published version to serve again (0: the drafter the "
                                                      "server started with)."))
    rollback: RollbackRule | None = None  # None: from the two fields above (code may give its own rule)
    train_devices: tuple[str, ...] | None = None  # --train-gpus as CUDA_VISIBLE_DEVICES, read before --gpus narrows it
    min_buffer: int = setting(8, Rule(int, low=1))
    keep: int = setting(8, Rule(int, low=1))  # published versions kept on disk (what a manual rollback can reach)
    max_len: int = setting(1024, Rule(int, low=16))
    poll_seconds: float = setting(1.0, Rule(float, low=0, low_open=True))
    seed: int = setting(0, Rule(int))

    def check(self) -> None:
        if not self.enabled and self.swap_dir is not None:
            raise self.refuse("swap_dir", "applies to {enabled}")
        if self.rollback is None:
            object.__setattr__(self, "rollback", RollbackRule(self.rollback_min_requests, self.rollback_drop,
                                                              held_out=self.holdout > 0))
        if self.train_devices is None:  # a bad GPU list is refused here, once
            object.__setattr__(self, "train_devices", tuple(self._parsed()))

    @property
    def devices(self) -> list[str]:
        """The trainer's CUDA_VISIBLE_DEVICES ([]: the CPU), as the GPUs this process saw when it was built."""
        return list(self.train_devices or ())

    def _parsed(self) -> list[str]:
        from adaflash.devices import child_devices

        try:
            return child_devices(self.train_gpus, "train_gpus") or []
        except ValueError as err:
            said = str(err).removeprefix("train_gpus: ").removeprefix("expected ")
            raise self.refuse("train_gpus", "must be " + said.replace("{", "(").replace("}", ")")) from None

    def to_json(self) -> dict[str, Any]:
        data = super().to_json()
        data["train_gpus"] = self.devices
        del data["train_devices"]
        data["rollback"] = {"min_requests": self.rollback.min_requests, "drop": self.rollback.drop,
                            "held_out": self.rollback.held_out} if self.rollback else None
        return data

    def for_server(self, method: str, engine: str, workspace: str, *, max_len: int | None = None,
                   seed: int = 0) -> AdaptConfig:
        """This config for a server of `method` on `engine`: its preset and swap dir chosen, the combinations
        it cannot train refused (SettingError naming the field)."""
        if engine != "embedded":
            raise SettingError("adapt", "enabled", "runs with the embedded engine ({engine} embedded)")
        if method not in ONLINE_TRAINABLE:
            raise SettingError("model", "method", f"must be one of {', '.join(ONLINE_TRAINABLE)} to adapt (it "
                                                  f"trains DFlash drafters), got {method}")
        preset = self.preset or (OSD if method == OSD else ADAFLASH)
        if method_of(method).length_head and preset == OSD:
            raise self.refuse("preset", "osd trains without the length head that {method} adaflash needs; use "
                                        "{method} osd or dflash")
        swap = Path(self.swap_dir).expanduser() if self.swap_dir else Path(workspace) / "adapt"
        changes: dict[str, Any] = {"preset": preset, "swap_dir": str(swap.resolve()), "seed": seed}
        if max_len is not None:
            changes["max_len"] = min(max_len, 2048)
        return self.replace(**changes)
