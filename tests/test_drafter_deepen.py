"""A trained DFlash drafter deepened: new layers start as identities, so it drafts as before, then train."""

from __future__ import annotations

import json

import torch
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.models.drafter_io import load_drafter, new_drafter, save_drafter
from tests.test_engine_lossless import make_requests
from tests.test_train import learnable, regen  # noqa: F401  (module fixtures)


def drafts_of(target, drafter) -> tuple[torch.Tensor, list[list[int]]]:
    """The drafter's block hidden states and drafts after two prompts' prefill."""
    engine = Engine(target, "dflash", drafter, config=EngineConfig(max_batch=2, max_len=512))
    for request in make_requests(target, n=2, max_new_tokens=24):
        engine.add(request)
    engine.step()  # the prefill: the drafter's context holds both prompts
    seqs = [engine.active[slot] for slot in sorted(engine.active)]
    rows, lens = torch.tensor([s.slot for s in seqs]), torch.tensor([s.length for s in seqs])
    pending = torch.tensor([s.pending for s in seqs])
    with torch.no_grad():
        hidden = drafter.block_hidden(engine.draft_cache, rows, pending, lens, target.model, int(lens.max()))
        drafts = drafter.tokens(hidden, drafter.max_draft, target.model)
    return hidden, drafts.tolist()


def test_a_deepened_drafter_drafts_as_before_and_round_trips(tmp_path, tiny_target):
    torch.manual_seed(0)
    drafter = new_drafter("dflash", tiny_target.model.cfg, block_size=4)
    for param in drafter.parameters():  # a drafter whose drafts get accepted now and then
        param.data.normal_(0, 0.3)
    hidden, drafts = drafts_of(tiny_target, drafter)
    drafter.deepen(3)
    assert len(drafter.layers) == 3 and drafter.cfg.num_hidden_layers == 3
    deep_hidden, deep_drafts = drafts_of(tiny_target, drafter)
    assert torch.equal(deep_hidden, hidden) and deep_drafts == drafts
    save_drafter(drafter, tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["num_hidden_layers"] == 3
    loaded = load_drafter(tmp_path / "d", tiny_target.model.cfg)
    assert len(loaded.layers) == 3 and drafts_of(tiny_target, loaded)[1] == drafts
    try:
        loaded.deepen(2)
    except ValueError as err:
        assert "has 3 layers; it can be deepened, not cut to 2" in str(err)
    else:
        raise AssertionError("a shallower depth was accepted")


def test_train_draft_deepens_an_init_drafter(tmp_path, learnable, regen):  # noqa: F811
    base, deep = tmp_path / "base", tmp_path / "deep"
    common = ["--workspace", str(tmp_path / "ws"), "train", "draft", "--method", "dflash", "--target",
              str(learnable.folder), "--data", str(regen), "--eval-prompts", "0", "--block-size", "4"]
    assert CliRunner().invoke(cli, [*common, "--out", str(base), "--steps", "2"]).exit_code == 0
    result = CliRunner().invoke(cli, [*common, "--out", str(deep), "--steps", "3", "--init", str(base), "--layers", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads((deep / "config.json").read_text())["num_hidden_layers"] == 2
    trained = load_drafter(deep, learnable.model.cfg)
    assert trained.layers[1].self_attn.o_proj.weight.abs().sum() > 0, "the new layer learned"
    result = CliRunner().invoke(cli, [*common, "--out", str(tmp_path / "cut"), "--steps", "1", "--init", str(deep),
                                      "--layers", "1"])
    assert result.exit_code == 2 and "it can be deepened, not cut to 1" in result.output, result.output
