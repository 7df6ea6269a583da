"""`adaflash serve --adapt` options and `adaflash serve rollback`: a server that learns its own traffic."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from adaflash.cli.common import fail
from adaflash.methods import ADAFLASH, ONLINE_TRAINABLE, OSD, method_of
from adaflash.pipeline.presets import PRESETS


def adapt_options(fn: Callable) -> Callable:
    options = [
        click.option("--adapt", is_flag=True,
                     help="Learn the traffic: record finished requests, train the drafter beside the server, "
                          "hot-swap each version it publishes (dflash, adaflash, osd; embedded engine)."),
        click.option("--swap-dir", default=None, metavar="DIR",
                     help="--adapt: trajectories and versions [default: WORKSPACE/adapt]. A restart on the same "
                          "folder serves its newest valid version and the trainer resumes after what it learned."),
        click.option("--adapt-sample", type=click.FloatRange(0, 1), default=1.0, show_default=True,
                     help="--adapt: share of finished requests recorded for training."),
        click.option("--adapt-holdout", type=click.FloatRange(0, 1, max_open=True), default=0.05, show_default=True,
                     help="--adapt: share of prompts (by a hash of their tokens) never trained on; the rollback rule "
                          "judges each version by its τ on them (0: on all traffic)."),
        click.option("--adapt-preset", type=click.Choice(sorted(PRESETS)), default=None,
                     help="--adapt: the trainer's loss: adaflash = reverse-KL mixture + length head, osd = forward "
                          "KL [default: osd for --method osd, else adaflash]."),
        click.option("--train-gpus", default="cpu", show_default=True,
                     help="--adapt: the trainer's GPUs (indices; several: torchrun) or 'cpu'."),
        click.option("--adapt-max-disk", type=click.FloatRange(min=0, min_open=True), default=2048.0,
                     show_default=True, metavar="MB",
                     help="--adapt: recording pauses while the swap dir holds this much (serving goes on)."),
        click.option("--adapt-train-batch", type=click.IntRange(1), default=8, show_default=True,
                     help="--adapt: recorded requests per training step."),
        click.option("--adapt-publish-every", type=click.IntRange(1), default=4, show_default=True,
                     help="--adapt: training steps per published version."),
        click.option("--adapt-lr", type=click.FloatRange(min=0, min_open=True), default=1e-4, show_default=True,
                     help="--adapt: the trainer's learning rate (higher follows a shift faster, and forgets faster)."),
        click.option("--rollback-min-requests", type=click.IntRange(1), default=32, show_default=True,
                     help="--adapt: requests the versions since the reference serve (on held-out prompts, see "
                          "--adapt-holdout) before their τ is compared with the reference's."),
        click.option("--rollback-drop", type=click.FloatRange(0, 1), default=0.1, show_default=True,
                     help="--adapt: roll a version back when its τ is lower than the reference's (the best version "
                          "accepted so far) by more than this fraction (docs/http-api.md)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def adapt_config(options: dict[str, Any], method: str, engine_kind: str, workspace: str) -> dict[str, Any] | None:
    """The adapt part of the server's configuration (None without --adapt); exits 2 on a bad combination."""
    from adaflash.pipeline.launch import parse_gpus

    if not options["adapt"]:
        given = [name for name in ("swap_dir",) if options[name] is not None]
        if given:
            fail("--swap-dir applies to --adapt")
        return None
    if engine_kind != "embedded":
        fail("--adapt runs with the embedded engine (--engine embedded)")
    if method not in ONLINE_TRAINABLE:
        fail(f"--adapt trains DFlash drafters: --method must be one of {', '.join(ONLINE_TRAINABLE)}, got {method}")
    preset = options["adapt_preset"] or (OSD if method == OSD else ADAFLASH)
    if method_of(method).length_head and preset == OSD:
        fail("--adapt-preset osd trains without the length head that --method adaflash needs; "
             "use --method osd or dflash")
    try:
        gpus = parse_gpus(options["train_gpus"], "--train-gpus")
    except ValueError as err:
        fail(str(err))
    swap = Path(options["swap_dir"]).expanduser() if options["swap_dir"] else Path(workspace) / "adapt"
    return {"swap_dir": str(swap.resolve()), "sample_rate": options["adapt_sample"],
            "holdout": options["adapt_holdout"], "preset": preset,
            "train_gpus": gpus, "max_disk_mb": options["adapt_max_disk"],
            "train_batch": options["adapt_train_batch"], "publish_every": options["adapt_publish_every"],
            "lr": options["adapt_lr"], "rollback_min_requests": options["rollback_min_requests"],
            "rollback_drop": options["rollback_drop"]}


def build_adapter(config: dict[str, Any], engine, *, target: str, draft: str, log, run_id: str, run_dir: Path, seed: int):
    """The server's Adapter, resumed from its swap dir (before the first request)."""
    from adaflash.serve.adapt import AdaptConfig, Adapter
    from adaflash.serve.adapt_stats import RollbackRule

    if PRESETS[config["preset"]]["length_head"] and not engine.drafter.predicts_length:
        raise ValueError(f"--adapt-preset {config['preset']} trains the length head, and {draft} has none: "
                         "give a drafter with a length head, or --method osd (--adapt-preset osd)")

    cfg = AdaptConfig(swap_dir=config["swap_dir"], sample_rate=config["sample_rate"], holdout=config["holdout"],
                      preset=config["preset"], train_gpus=config["train_gpus"], max_disk_mb=config["max_disk_mb"],
                      rollback=RollbackRule(config["rollback_min_requests"], config["rollback_drop"],
                                            held_out=config["holdout"] > 0),
                      train_batch=config["train_batch"], publish_every=config["publish_every"],
                      lr=config["lr"], max_len=min(engine.max_len, 2048), seed=seed)
    adapter = Adapter(cfg, engine, target=target, draft=draft, log=log, run_id=run_id, run_dir=run_dir)
    adapter.resume()
    return adapter


@click.command()
@click.option("--to", "version", type=click.IntRange(0), required=True,
              help="The published version to serve again (0: the drafter the server started with).")
@click.option("--url", default="http://127.0.0.1:30000", show_default=True, help="The adapting server.")
@click.option("--api-key", envvar="ADAFLASH_API_KEY", default=None, help="[env ADAFLASH_API_KEY]")
def rollback(version: int, url: str, api_key: str | None) -> None:
    """Make an adapting server serve an earlier drafter version again (POST /adapt/rollback).

    The versions published above it are set aside for good, and the trainer starts again from it;
    the next version the trainer publishes is tried as usual.
    """
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    request = urllib.request.Request(url.rstrip("/") + "/adapt/rollback", data=json.dumps({"to": version}).encode(),
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=660) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        try:
            message = json.loads(err.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = err.reason
        fail(f"{url}: {message}")
    except (urllib.error.URLError, OSError) as err:
        fail(f"cannot reach {url}: {getattr(err, 'reason', err)}")
    click.echo(body.get("message", ""))
