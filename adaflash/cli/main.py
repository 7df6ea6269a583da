"""Entry point of `adaflash`: a lazy click group so `--help` and light commands start fast."""

from __future__ import annotations

import errno
import importlib
import os
import sys

import click

from adaflash.cli.groups import use, uses
from adaflash.options import JobConfig

# name -> (module, attribute, one-line description). The description is shown by `--help`
# without importing the module, so torch is never loaded just to list commands.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "models": ("adaflash.cli.models", "models", "List and prepare the built-in target models."),
    "draft": ("adaflash.cli.draft", "draft", "Create and inspect drafters (DFlash/AdaFlash, EAGLE-3, MTP)."),
    "eval": ("adaflash.cli.evaluate", "evaluate", "Measure τ and throughput of methods offline on the same prompts."),
    "generate": ("adaflash.cli.generate", "generate", "Generate with a target (and a drafter) through the embedded engine."),
    "data": ("adaflash.cli.data", "data", "Prepare datasets into normalized rows; regenerate answers with the target."),
    "train": ("adaflash.cli.train", "train", "Train drafters offline and initialize the AdaFlash length head."),
    "serve": ("adaflash.cli.serve", "serve", "Serve a method over HTTP (SGLang's dialect): embedded engine or SGLang."),
    "bench": ("adaflash.cli.bench", "bench", "Benchmark a server (SGLang bench_serving metrics) or a matrix of methods."),
    "pipeline": ("adaflash.cli.pipeline", "pipeline", "Run the async on-policy pipeline (AdaFlash / OSD presets)."),
    "runs": ("adaflash.cli.runs", "runs", "Read and manage the run log: list, show, compare, export, import, attach, stop."),
    "gpus": ("adaflash.cli.gpus", "gpus", "GPUs, their processes and adaflash jobs, host CPU/RAM (--json, --watch)."),
    "run": ("adaflash.cli.run", "run", "Run a recipe: plan, start and supervise its jobs (--dry-run, --detach)."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@uses(use(JobConfig, only=("workspace",)), command="adaflash")
@click.version_option(package_name="adaflash")
@click.pass_context
def cli(ctx: click.Context, job: JobConfig) -> None:
    """adaflash: adaptive speculative decoding with on-policy distilled diffusion drafters."""
    ctx.ensure_object(dict)
    ctx.obj["workspace"] = job.workspace


def main() -> None:
    """Click's own handling, but Ctrl-C exits 130 (as `adaflash run` documents; click says "Aborted!" and
    exits 1), and a path that cannot be read or written is one line naming it, not a traceback."""
    from adaflash.extras import MissingExtraError
    from adaflash.runlog import RunLogError

    try:
        code = cli.main(obj={}, standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except MissingExtraError as err:
        click.secho(f"error: {err}", fg="red", err=True)
        sys.exit(1)
    except (OSError, RunLogError) as err:
        if isinstance(err, OSError) and err.errno == errno.EPIPE:  # `adaflash runs list | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        click.secho(f"error: {err}", fg="red", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
