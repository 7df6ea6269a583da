"""The model group: which method runs, on which target, with which drafter, where and in what dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from adaflash.methods import METHOD_NAMES, VANILLA
from adaflash.settings import Rule, Settings, setting

DTYPE_HELP = ("bf16-if-native: bf16 on a GPU and on a CPU with a bf16 unit (there speculative decoding pays), float32 "
              "on other CPUs; auto: bf16 on a GPU, float32 on any CPU; float32, bfloat16 or float16. In float32 and "
              "bf16 a request's greedy tokens are the target's own for that request alone, whatever the method and "
              "the batch (fp16 on a CPU is not checked; docs/engine.md, 'Batch invariance'). A written model or "
              "drafter (models synth, draft export): its weights' dtype.")
NO_DEFAULT = ("bench", "bench shift", "runs list", "runs import", "draft info")  # read from elsewhere, or a filter


@dataclass(frozen=True)
class ModelConfig(Settings):
    """`method` and `draft` are repeatable where a command runs several methods (eval, bench matrix, bench
    engine); `one()` is the single (method, drafter) of the others."""

    GROUP: ClassVar[str] = "model"

    method: tuple[str, ...] = setting((VANILLA,), Rule(
        str, multiple=True, flag="--method", metavar=f"[{'|'.join(METHOD_NAMES)}][=DRAFT]",
        per_command=tuple((name, ()) for name in ("eval", "train draft", "draft new", *NO_DEFAULT)),
        help=f"Decoding method, one of {', '.join(METHOD_NAMES)}; METHOD=DRAFT also names its drafter. Repeatable "
             "where methods are compared (eval); a filter in runs list; the drafter's architecture in "
             "train draft and draft new (dflash, eagle3, mtp)."))
    target: str | None = setting("smollm2-135m", Rule(
        str, optional=True, flag="--target", per_command=tuple((name, None) for name in NO_DEFAULT),
        help="Target model: a built-in name, an HF model folder (e.g. one `adaflash models synth` wrote) or "
             "hub id [bench, bench shift: the server's; draft info: validate against it when given]."))
    draft: tuple[str, ...] = setting((), Rule(
        str, multiple=True, flag="--draft", metavar="DIR|NAME",
        help="Drafter folder or built-in drafter's name (`adaflash draft builtins`; dflash and adaflash default "
             "to the target's built-in drafter). Where several methods run (bench matrix, bench engine): "
             "METHOD=DIR, repeatable."))
    device: str = setting("auto", Rule(str, flag="--device", help="cpu, cuda, cuda:N or auto (a GPU if there "
                                                                   "is one)."))
    dtype: str | None = setting("bf16-if-native", Rule(
        str, optional=True, flag="--dtype", per_command=(("draft export", None), ("models synth", "bf16"), ("train promote", None)),
        help=DTYPE_HELP))

    def check(self) -> None:
        for spec in self.method:
            name = spec.partition("=")[0].strip()
            if name not in METHOD_NAMES:
                raise self.refuse("method", f"must be one of {', '.join(METHOD_NAMES)} (optionally =DRAFT), "
                                            f"got {spec!r}")

    @property
    def methods(self) -> list[tuple[str, str | None]]:
        """(method, its =DRAFT or None) per --method, in order."""
        out = []
        for spec in self.method:
            name, _, draft = (part.strip() for part in spec.partition("="))
            out.append((name, draft or None))
        return out

    def one(self) -> tuple[str | None, str | None]:
        """The single method and drafter of a command that runs one (None where none was given)."""
        if len(self.method) > 1:
            raise self.refuse("method", "is given once here (one method runs)")
        drafts = [d for d in self.draft if not _keyed(d)]
        if len(self.draft) > 1:
            raise self.refuse("draft", "is given once here (one drafter runs)")
        method, inline = self.methods[0] if self.methods else (None, None)
        keyed = [d.partition("=")[2] for d in self.draft if _keyed(d) and d.partition("=")[0] == method]
        return method, inline or (drafts or keyed or [None])[0]

    def draft_map(self) -> dict[str, str]:
        """METHOD=DIR per --draft (bench matrix, bench engine); a ValueError names a malformed one."""
        out: dict[str, str] = {}
        for item in self.draft:
            key, sep, value = item.partition("=")
            if not sep or key not in METHOD_NAMES or not value:
                raise self.refuse("draft", f"takes METHOD=DIR with METHOD one of {', '.join(METHOD_NAMES)}, "
                                           f"got {item!r}")
            out[key] = value
        return out


def _keyed(value: str) -> bool:
    return value.partition("=")[0] in METHOD_NAMES and "=" in value
