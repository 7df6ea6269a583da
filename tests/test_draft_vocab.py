"""Draft vocabularies: the drafter scores only frequent tokens; outputs stay the target's, training still works."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.models.drafter_io import DrafterError, frequent_tokens, load_drafter, new_drafter, save_drafter
from adaflash.train.data import load_sequences
from adaflash.train.evaluate import eval_tau
from adaflash.train.loop import TrainConfig, Trainer, build_drafter
from tests.test_engine_lossless import make_requests, vanilla
from tests.test_train import PROMPTS, learnable, regen  # noqa: F401  (module fixtures)


def test_frequent_tokens_picks_the_most_common_and_keeps_eos():
    vocab = frequent_tokens([[5, 5, 5, 7, 7, 9], [7, 3]], size=3, vocab_size=20, always=[1])
    assert vocab.tolist() == [1, 5, 7]


@pytest.mark.parametrize("method", ["dflash", "mtp"])
def test_draft_vocab_drafter_is_lossless_and_round_trips(tmp_path, tiny_target, method):
    vocab = torch.arange(100, 164)
    drafter = new_drafter(method, tiny_target.model.cfg, block_size=8, steps=4, draft_vocab=vocab)
    save_drafter(drafter, tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["draft_vocab_size"] == 64
    loaded = load_drafter(tmp_path / "d", tiny_target.model.cfg)
    assert torch.equal(loaded.draft_vocab, vocab)
    engine = Engine(tiny_target, method, loaded, config=EngineConfig(max_batch=2, max_len=512))
    outputs = engine.generate(make_requests(tiny_target, n=2, max_new_tokens=16))
    assert [o.output_ids for o in outputs] == [o.output_ids for o in vanilla(tiny_target, make_requests(tiny_target, n=2, max_new_tokens=16))]
    drafts, _ = loaded.draft(engine.draft_cache, torch.tensor([0]), torch.tensor([5]), torch.tensor([1]),
                             tiny_target.model, 1)
    assert set(drafts.flatten().tolist()) <= set(vocab.tolist()), "drafts come from the draft vocabulary"


def test_a_whole_vocabulary_drafter_takes_a_draft_vocabulary(tmp_path, tiny_target):
    drafter = new_drafter("dflash", tiny_target.model.cfg, block_size=4)
    assert drafter.draft_vocab is None
    drafter.set_draft_vocab(torch.arange(40, 72))
    save_drafter(drafter, tmp_path / "d")
    loaded = load_drafter(tmp_path / "d", tiny_target.model.cfg)
    assert loaded.draft_vocab.tolist() == list(range(40, 72))
    drafts, _ = loaded.draft(Engine(tiny_target, "dflash", loaded,
                                    config=EngineConfig(max_batch=1, max_len=64)).draft_cache,
                             torch.tensor([0]), torch.tensor([5]), torch.tensor([1]), tiny_target.model, 1)
    assert set(drafts.flatten().tolist()) <= set(range(40, 72))


def test_bad_draft_vocab_size_names_the_field(tmp_path, tiny_target):
    save_drafter(new_drafter("dflash", tiny_target.model.cfg, draft_vocab=torch.arange(10, 30)), tmp_path / "d")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    cfg["draft_vocab_size"] = "many"
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(DrafterError, match="draft_vocab_size"):
        load_drafter(tmp_path / "d", tiny_target.model.cfg)


def test_training_with_a_draft_vocab_raises_tau(tmp_path, learnable, regen):  # noqa: F811
    sequences = load_sequences(regen, learnable, 256)
    vocab = frequent_tokens([s.ids[s.response_start:] for s in sequences], 256, learnable.model.cfg.vocab_size,
                            always=learnable.eos_ids)
    cfg = TrainConfig(method="dflash", out=str(tmp_path / "d"), steps=40, lr=3e-3, block_size=8, blocks_per_seq=8,
                      batch_tokens=2048)
    trainer = Trainer(cfg, learnable, build_drafter(cfg, learnable, vocab))
    prompts = [learnable.render(p) for p in PROMPTS[:6]]
    before = eval_tau(learnable, trainer.drafter, prompts, max_new_tokens=32)["eval_tau"]
    trainer.run(sequences)
    after = eval_tau(learnable, trainer.drafter, prompts, max_new_tokens=32)["eval_tau"]
    assert after > before + 0.5, (before, after)


def test_train_cli_draft_vocab(tmp_path, learnable, regen):  # noqa: F811
    out = tmp_path / "d"
    args = ["--workspace", str(tmp_path / "ws"), "train", "draft", "--method", "mtp", "--target", str(learnable.folder),
            "--data", str(regen), "--out", str(out), "--steps", "2", "--draft-vocab", "128", "--eval-prompts", "0"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["draft_vocab_size"] == 128
    # given with --init the vocabulary is chosen anew (wider here)
    wider = tmp_path / "wider"
    result = CliRunner().invoke(cli, [*args[:args.index("--out")], "--out", str(wider), "--steps", "1",
                                      "--draft-vocab", "192", "--eval-prompts", "0", "--init", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((wider / "config.json").read_text())["draft_vocab_size"] == 192
    narrow, wide = load_drafter(out, learnable.model.cfg), load_drafter(wider, learnable.model.cfg)
    assert set(narrow.draft_vocab.tolist()) < set(wide.draft_vocab.tolist())
    assert wide.draft_vocab.tolist() == sorted(wide.draft_vocab.tolist())
    # a depth asked of a chain drafter is refused, not dropped (DFlash drafters are deepened: test_drafter_deepen.py)
    result = CliRunner().invoke(cli, [*args[:-4], "--eval-prompts", "0", "--init", str(out), "--layers", "2"])
    assert result.exit_code == 2 and "--layers deepens DFlash drafters" in result.output, result.output
