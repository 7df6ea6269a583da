"""`adaflash serve rollback`: undo a version of a server that learns its own traffic (its settings:
`adaflash.serve.adapt_config`)."""

from __future__ import annotations

import json

import click

from adaflash.cli.common import fail
from adaflash.cli.groups import use, uses
from adaflash.options import ServeConfig
from adaflash.serve.adapt_config import AdaptConfig


@click.command()
@uses(use(AdaptConfig, only=("rollback_to",)), use(ServeConfig, only=("server_url", "api_key")),
      command="serve rollback")
def rollback(adapt: AdaptConfig, serve: ServeConfig) -> None:
    """Make an adapting server serve an earlier drafter version again (POST /adapt/rollback).

    The versions published above it are set aside for good, and the trainer starts again from it;
    the next version the trainer publishes is tried as usual.
    """
    import urllib.error
    import urllib.request

    api_key, url, version = serve.api_key, serve.server_url, adapt.rollback_to
    if version is None:
        fail("--to N is required: the published version to serve again")
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
