"""Training: losses, the DFlash block mask, bit-for-bit resume, and drafters that really improve τ."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.engine.config import EngineConfig
from adaflash.engine.engine import Engine
from adaflash.engine.params import Request, SamplingParams
from adaflash.models.drafter_io import load_drafter
from adaflash.train.chain import ttt_mask
from adaflash.train.data import load_sequences
from adaflash.train.dflash import block_mask
from adaflash.train.evaluate import eval_tau
from adaflash.train.loop import TrainConfig, Trainer
from adaflash.train.losses import LossConfig, distill_loss, position_decay

PROMPTS = [f"Tell me about the number {i}." for i in range(12)]


# The module-scoped fixtures below are built once: keep this module's tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("test_train")


@pytest.fixture(scope="module")
def learnable(tmp_path_factory, smollm2_folder):
    """A tiny target whose greedy output is a context-dependent, mostly repeating pattern."""
    from adaflash.models.loading import load_target
    from adaflash.models.tiny import make_tiny_target

    folder = make_tiny_target(tmp_path_factory.mktemp("learnable"), smollm2_folder, init_std=0.08)
    return load_target(str(folder), device="cpu")


@pytest.fixture(scope="module")
def regen(tmp_path_factory, learnable):
    """Rows answered by the target itself: exact prompt string + greedy response."""
    tiny_target = learnable
    path = tmp_path_factory.mktemp("regen") / "regen.jsonl"
    texts = [tiny_target.render(p) for p in PROMPTS]
    outputs = Engine(tiny_target, "vanilla", config=EngineConfig(max_batch=12, max_len=256)).generate(
        [Request(tiny_target.encode(t), SamplingParams(max_new_tokens=48, ignore_eos=True), prompt_text=t) for t in texts])
    with path.open("w") as handle:
        for out in outputs:
            handle.write(json.dumps({"prompt_text": out.prompt_text, "response": out.text,
                                     "finish_reason": out.meta_info["finish_reason"]}) + "\n")
    return path


def test_losses():
    torch.manual_seed(0)
    student, teacher = torch.randn(6, 50), torch.randn(6, 50)
    weights = torch.ones(6)
    ce, _ = distill_loss(student, teacher.argmax(-1), None, weights, LossConfig("ce"))
    mix1, stats = distill_loss(student, teacher.argmax(-1), teacher, weights, LossConfig("rkl-mix", alpha=1.0))
    assert torch.allclose(ce, mix1)
    assert 0.0 <= stats["clip_ratio"] <= 1.0
    mix0, stats0 = distill_loss(student, teacher.argmax(-1), teacher, weights, LossConfig("rkl-mix", alpha=0.0, clip=1e-6))
    assert stats0["clip_ratio"] == 1.0 and mix0.item() == pytest.approx(6 * 1e-6, rel=1e-3)
    same, _ = distill_loss(teacher, teacher.argmax(-1), teacher, weights, LossConfig("fkl"))
    assert same.item() == pytest.approx(0.0, abs=1e-5)
    decay = position_decay(4, 7.0)
    assert decay[0] == 0 and decay[1] == 1 and decay[2] == pytest.approx(torch.exp(torch.tensor(-1 / 7)).item())
    with pytest.raises(ValueError, match="loss must be one of"):
        LossConfig("mse")


def test_block_mask_sees_context_before_its_anchor_and_its_own_block():
    mask = block_mask(torch.tensor([[2, 5]]), ctx_len=8, block=3)[0]
    assert mask.shape == (6, 8 + 6)
    assert mask[0, :8].tolist() == [True, True] + [False] * 6  # anchor 2 sees positions 0, 1
    assert mask[3, :8].tolist() == [True] * 5 + [False] * 3  # anchor 5 sees 0..4
    assert mask[1, 8:].tolist() == [True] * 3 + [False] * 3
    assert mask[4, 8:].tolist() == [False] * 3 + [True] * 3


def test_ttt_mask_is_causal_then_diagonal():
    mask = ttt_mask(5, 2, torch.device("cpu"))
    assert mask.shape == (5, 15)
    assert mask[4, :5].tolist() == [True, True, True, False, False]  # step-0 keys up to p - 2
    assert mask[4, 5:10].tolist() == [False, False, False, True, False]  # step-1 key at p - 1
    assert mask[4, 10:].tolist() == [False, False, False, False, True]  # own key at p


def _cfg(tmp_path, **kw):
    base = dict(method="dflash", out=str(tmp_path / "d"), steps=6, lr=2e-3, warmup_steps=1, batch_tokens=600,
                blocks_per_seq=6, block_size=8, save_every=3, seed=3)
    base.update(kw)
    return TrainConfig(**base)


def test_resume_is_bit_for_bit(tmp_path, learnable, regen):
    tiny_target = learnable
    sequences = load_sequences(regen, tiny_target, 256)
    straight = Trainer(_cfg(tmp_path / "a"), tiny_target)
    straight.run(sequences)

    class Killed(Exception):
        pass

    def die_after_three(step, total, stats):
        if step == 3:
            raise Killed

    first = Trainer(_cfg(tmp_path / "b"), tiny_target)
    with pytest.raises(Killed):
        first.run(sequences, on_step=die_after_three)
    resumed = Trainer(_cfg(tmp_path / "b", resume=True), tiny_target)
    resumed.run(sequences)
    assert resumed.state.step == 6
    a = load_drafter(tmp_path / "a" / "d").state_dict()
    b = load_drafter(tmp_path / "b" / "d").state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    finished = Trainer(_cfg(tmp_path / "b", resume=True, steps=4), tiny_target)  # fewer steps than it has
    with pytest.raises(ValueError, match="is at step 6, already the run's 4 steps"):
        finished.run(sequences)
    assert all(torch.equal(b[k], v) for k, v in load_drafter(tmp_path / "b" / "d").state_dict().items())


def test_dflash_training_raises_tau(tmp_path, learnable, regen):
    tiny_target = learnable
    sequences = load_sequences(regen, tiny_target, 256)
    trainer = Trainer(_cfg(tmp_path, steps=20, lr=3e-3, length_head=True), tiny_target)  # 20 steps: tau 1.0 -> 3.2
    prompts = [tiny_target.render(p) for p in PROMPTS[:6]]
    before = eval_tau(tiny_target, trainer.drafter, prompts, max_new_tokens=32)["eval_tau"]
    trainer.run(sequences)
    after = eval_tau(tiny_target, trainer.drafter, prompts, max_new_tokens=32)["eval_tau"]
    assert after > before + 0.5, (before, after)


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_chain_training_lowers_loss_and_raises_tau(tmp_path, learnable, regen, method):
    tiny_target = learnable
    sequences = load_sequences(regen, tiny_target, 256)
    trainer = Trainer(_cfg(tmp_path, method=method, steps=15, lr=3e-3, ttt_length=3, steps_chain=4),  # 15 steps: tau 1.0 -> 3.1+
                      tiny_target)
    losses = []
    prompts = [tiny_target.render(p) for p in PROMPTS[:4]]
    before = eval_tau(tiny_target, trainer.drafter, prompts, max_new_tokens=24)["eval_tau"]
    trainer.run(sequences, on_step=lambda step, total, stats: losses.append(stats["loss"]))
    after = eval_tau(tiny_target, trainer.drafter, prompts, max_new_tokens=24)["eval_tau"]
    assert sum(losses[-5:]) < sum(losses[:5])
    assert after > before + 0.3, (before, after)


def test_train_cli_records_run_and_checkpoint(tmp_path, learnable, regen):
    tiny_llama = learnable.folder
    ws = tmp_path / "ws"
    out = tmp_path / "draft"
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "train", "draft", "--method", "dflash", "--target",
                                      str(tiny_llama), "--data", str(regen), "--out", str(out), "--steps", "3",
                                      "--block-size", "8", "--blocks-per-seq", "4", "--eval-prompts", "2",
                                      "--feature-memo-gb", "2.5"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["eval_tau_after"] >= 1.0 and summary["tokens_per_s"] > 0
    assert "peak_memory_gib" not in summary  # a GPU's figure: a CPU run has none to report
    # the drafter folder holds what a server loads; the trainer's state is kept beside it, in parts
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert (tmp_path / "draft-train" / "checkpoint.json").is_file()
    from adaflash.runlog import RunLog

    log = RunLog.open(ws)
    run = log.list_runs(kind="train")[0]
    assert run["config"]["memo_gb"] == "2.5"
    names = {m["name"] for m in log.metrics_since(0, run_id=run["id"])}
    assert {"loss", "lr", "tokens_per_s", "eval_tau", "feature_memo_gb"} <= names
    memo = [m["value"] for m in log.metrics_since(0, run_id=run["id"]) if m["name"] == "feature_memo_gb"]
    assert memo[0] > 0  # the first batch's features are kept (a CPU budget is 4 GB)
    assert log.checkpoints(run["id"])[0]["path"] == str(out)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_text": "x"}\n')
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "train", "draft", "--method", "dflash", "--target",
                                      str(tiny_llama), "--data", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "bad.jsonl:1" in result.output
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "train", "draft", "--method", "dflash", "--target",
                                      str(tiny_llama), "--data", str(regen), "--out", str(tmp_path / "o"),
                                      "--init", str(out), "--init-from-target"])
    assert result.exit_code == 2 and "--init-from-target" in result.output and "--init " in result.output
    # --block-size with --init: the same weights, trained and saved at the new block
    wider = tmp_path / "wider"
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "train", "draft", "--method", "dflash", "--target",
                                      str(tiny_llama), "--data", str(regen), "--out", str(wider), "--init", str(out),
                                      "--block-size", "12", "--steps", "1", "--blocks-per-seq", "2",
                                      "--eval-prompts", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads((wider / "config.json").read_text())["block_size"] == 12
    assert json.loads((out / "config.json").read_text())["block_size"] == 8


def test_train_profile_names_the_ops_of_the_recorded_steps(tmp_path, learnable, regen):
    base = ["--workspace", str(tmp_path / "ws"), "train", "draft", "--method", "dflash", "--target",
            str(learnable.folder), "--data", str(regen), "--block-size", "4", "--blocks-per-seq", "2",
            "--batch-tokens", "64", "--eval-prompts", "0"]
    for steps, wanted, recorded in (("5", "2", 2), ("4", "4", 1)):  # the second run ends inside the window
        folder = tmp_path / f"profile-{steps}"
        result = CliRunner().invoke(cli, [*base, "--out", str(tmp_path / f"d{steps}"), "--steps", steps,
                                          "--profile", str(folder), "--profile-steps", wanted, "--profile-after", "3"])
        assert result.exit_code == 0, result.output
        table = (folder / "train.top.txt").read_text()
        assert table.startswith(f"{recorded} training steps after 3: ") and "ms a step" in table
        assert "aten::mm" in table or "aten::addmm" in table
        assert json.loads((folder / "train.trace.json").read_text())["traceEvents"]


def test_torchrun_data_parallel_on_cpu(tmp_path, learnable, regen):
    """The same command under torchrun (2 processes, gloo) trains and writes one checkpoint."""
    import subprocess
    import sys

    out = tmp_path / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "adaflash.cli.main", "--workspace", str(tmp_path / "ws"), "train", "draft", "--method", "dflash",
               "--target", str(learnable.folder), "--data", str(regen), "--out", str(out), "--steps", "2",
               "--block-size", "8", "--blocks-per-seq", "2", "--batch-tokens", "300", "--eval-prompts", "0",
               "--device", "cpu"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    from adaflash.train.checkpoint import load_checkpoint

    state = load_checkpoint(tmp_path / "ddp-train")
    assert state["state"]["step"] == 2 and state["config"]["steps"] == 2
    from adaflash.runlog import RunLog

    runs = RunLog.open(tmp_path / "ws").list_runs(kind="train")
    assert len(runs) == 1 and runs[0]["config"]["world_size"] == 2  # only rank 0 records


def test_memo_greedy_tokens_give_the_length_head_the_same_labels_as_teacher_logits(learnable, regen):
    """CE + length head: the memo's greedy tokens stand in for the teacher's argmax, exactly."""
    from adaflash.models.drafter_io import new_drafter
    from adaflash.train.data import pad
    from adaflash.train.dflash import dflash_loss
    from adaflash.train.features import FeatureMemo, direct_features

    target = learnable.model
    sequences = load_sequences(regen, learnable, 256)[:5]
    ids, lens, starts = pad(sequences, torch.device("cpu"))
    drafter = new_drafter("dflash", target.cfg, block_size=6, length_head=True, seed=1)
    memo = FeatureMemo(target, drafter.target_layer_ids, keep_greedy=True)
    source = memo.source([id(s) for s in sequences])
    direct = direct_features(target, drafter.target_layer_ids)
    # the greedy tokens are the teacher's argmax at every real position
    _, final = direct(ids, lens, True)
    greedy = source.greedy(ids, lens)
    for row, n in enumerate(lens.tolist()):
        assert torch.equal(greedy[row, :n], target.logits(final[row, :n]).argmax(-1))
    # and the loss (drafter CE + the head's MSE on acceptance) is the same either way
    # a memo past its budget stores nothing and makes features and greedy tokens in one target pass
    full = FeatureMemo(target, drafter.target_layer_ids, budget_bytes=0, keep_greedy=True)
    full.used = 1
    over = full.source([id(s) for s in sequences])
    stats = []
    for features in (direct, source, over):
        loss, stat = dflash_loss(drafter, target, ids, lens, starts, blocks_per_seq=4, loss_cfg=LossConfig("ce"),
                                 gen=torch.Generator().manual_seed(0), train_head=True, features=features)
        stats.append((float(loss.detach()), stat["block_accept_len"], stat["loss_length_head"]))
    assert stats[0] == pytest.approx(stats[1], rel=1e-5) and stats[0] == pytest.approx(stats[2], rel=1e-5)
    assert len(memo.greedy_ids) == len(sequences)  # kept: later epochs run no lm_head for them
    assert not full.store and full.batch_greedy is not None  # over budget: the batch's pass, nothing kept


def test_training_features_match_the_cached_forward_the_engine_runs(learnable, regen):
    """`hidden_states` (no cache, no mask, training's path) gives the features of the engine's cached
    pass at every real position of right-padded rows, and runs no layer past the last one captured."""
    from adaflash.train.data import pad

    target = learnable.model
    sequences = [dataclasses.replace(s, ids=s.ids[: len(s.ids) - 7 * i])
                 for i, s in enumerate(load_sequences(regen, learnable, 256)[:5])]
    ids, lens, _ = pad(sequences, torch.device("cpu"))
    b, width = ids.shape
    capture = [0, 2]
    _, cached = target(ids, torch.arange(width).expand(b, width), target.new_cache(b, width), torch.arange(b),
                       capture=capture)
    direct = target.hidden_states(ids, capture)
    assert len(set(lens.tolist())) > 1  # rows of several lengths: the padding is exercised
    for mine, engine in zip(direct, cached):
        for row, n in enumerate(lens.tolist()):
            torch.testing.assert_close(mine[row, :n], engine[row, :n], rtol=1e-5, atol=1e-5)
    mlp_calls = []
    hooks = [layer.mlp.register_forward_hook(lambda *_: mlp_calls.append(1)) for layer in target.model.layers]
    try:
        target.hidden_states(ids, [1])
    finally:
        for hook in hooks:
            hook.remove()
    assert len(mlp_calls) == 2  # layers 0 and 1 only


def test_a_memo_budget_of_zero_keeps_only_the_first_batch(tmp_path, learnable, regen):
    sequences = load_sequences(regen, learnable, 256)
    trainer = Trainer(_cfg(tmp_path, steps=3, batch_tokens=200, memo_gb=0.0), learnable)
    trainer.run(sequences)
    assert trainer.memo.budget == 0.0 and 0 < len(trainer.memo.store) < len(sequences)
    default = Trainer(_cfg(tmp_path / "b", steps=3, batch_tokens=200), learnable)
    default.run(sequences)
    assert default.memo.budget == 4e9 and len(default.memo.store) > len(trainer.memo.store)


def test_memo_in_bf16_changes_no_bit_of_a_dflash_loss_under_autocast(learnable, regen):
    """The GPU trainer keeps features in bf16: its autocast rounds them so before the fc anyway."""
    from adaflash.models.drafter_io import new_drafter
    from adaflash.train.data import pad
    from adaflash.train.dflash import dflash_loss
    from adaflash.train.features import FeatureMemo

    target = learnable.model
    sequences = load_sequences(regen, learnable, 256)[:4]
    ids, lens, starts = pad(sequences, torch.device("cpu"))
    drafter = new_drafter("dflash", target.cfg, block_size=4, length_head=True, seed=2)
    wide, half, other = (FeatureMemo(target, drafter.target_layer_ids, keep_greedy=True, store_dtype=dtype)
                         for dtype in (None, torch.bfloat16, torch.float16))
    keys = [id(s) for s in sequences]
    losses = []
    for memo in (wide, half, other):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, stats = dflash_loss(drafter, target, ids, lens, starts, blocks_per_seq=4, loss_cfg=LossConfig("ce"),
                                      gen=torch.Generator().manual_seed(0), train_head=True, features=memo.source(keys))
        losses.append(float(loss.detach()))
    assert losses[0] == losses[1]
    assert losses[2] != losses[0]  # another rounding than the autocast's own would show
    assert all(f.dtype == torch.bfloat16 for f, _ in half.store.values())
    assert half.used * 2 == wide.used  # the same sequences in half the bytes

def test_init_from_target_copies_the_layers_after_the_deepest_feature(learnable):
    """The drafter starts as the target's next layer reading the deepest feature layer's output."""
    from adaflash.models.drafter_io import init_from_target, new_drafter

    target = learnable.model
    drafter = new_drafter("dflash", target.cfg, layers=1, block_size=4)
    deepest = max(drafter.target_layer_ids)
    copied = init_from_target(drafter, target)
    assert copied == [min(deepest + 1, target.cfg.num_hidden_layers - 1)]
    src = target.model.layers[copied[0]]
    assert torch.equal(drafter.layers[0].mlp.down_proj.weight, src.mlp.down_proj.weight)
    assert torch.equal(drafter.layers[0].self_attn.k_proj.weight, src.self_attn.k_proj.weight)
    # fc passes the deepest feature through: the context is that layer's output, normed as src's input
    feats = torch.randn(2, 3, drafter.feature_size)
    chunk = drafter.target_layer_ids.index(deepest) * target.cfg.hidden_size
    expected = src.input_layernorm(feats[..., chunk : chunk + target.cfg.hidden_size])
    assert torch.allclose(drafter.context(feats), expected, atol=1e-6)


def test_periodic_evaluation_keeps_the_best_drafter_beside_the_latest(tmp_path, learnable, regen):
    """With --eval-every, OUT-best holds the drafter of the highest evaluated τ, and the summary names it."""
    from adaflash.models.drafter_io import load_drafter
    from adaflash.runlog import RunLog

    ws, out = tmp_path / "ws", tmp_path / "draft"
    result = CliRunner().invoke(cli, ["--workspace", str(ws), "train", "draft", "--method", "dflash", "--target",
                                      str(learnable.folder), "--data", str(regen), "--out", str(out), "--steps", "4",
                                      "--lr", "3e-3", "--block-size", "8", "--blocks-per-seq", "4",
                                      "--eval-prompts", "2", "--eval-every", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    log = RunLog.open(ws)
    run_id = log.list_runs(kind="train")[0]["id"]
    taus = [m["value"] for m in log.metrics_since(0, run_id=run_id) if m["name"] == "eval_tau"]
    assert summary["best_eval_tau"] == pytest.approx(max(taus)) and 1 <= summary["best_step"] <= 4
    best = tmp_path / "draft-best"
    assert summary["best"] == str(best)
    config = json.loads((best / "config.json").read_text())
    assert config["adaflash"]["step"] == summary["best_step"]
    assert config["adaflash"]["eval_tau"] == pytest.approx(summary["best_eval_tau"])
    load_drafter(best, learnable.model.cfg)  # a whole drafter, loadable like the latest one
    assert str(best) in {c["path"] for c in log.checkpoints(run_id)}


def test_length_head_follows_the_drafter_schedule_at_its_own_peak(tmp_path, learnable, regen):
    """A warmup step at a quarter of the drafter's rate runs the head at a quarter of its peak, and a
    trained head barely moves at a tiny rate (fresh Adam state takes sign-sized first steps otherwise)."""
    from adaflash.train.loop import HEAD_LR

    trainer = Trainer(_cfg(tmp_path, length_head=True, lr=1e-4), learnable)
    sequences = load_sequences(regen, learnable, 256)[:4]
    before = [p.detach().clone() for p in trainer.drafter.length_head.parameters()]
    trainer.step_on(sequences, 1e-4 / 4)
    assert trainer.head_opt.param_groups[0]["lr"] == pytest.approx(HEAD_LR / 4)
    trainer.step_on(sequences, 1e-4 * 1e-4)
    assert trainer.head_opt.param_groups[0]["lr"] == pytest.approx(HEAD_LR * 1e-4)
    moved = max(float((p - q).abs().max()) for p, q in zip(trainer.drafter.length_head.parameters(), before))
    assert 0 < moved <= 1.1 * (HEAD_LR / 4 + HEAD_LR * 1e-4)  # Adam moves each weight by at most ~lr per step


def test_a_regenerated_row_trains_on_its_output_ids_not_a_re_encoding(tiny_target):
    """The target's own tokens are what the drafter must predict; text re-encoded may tokenize otherwise."""
    from adaflash.train.data import row_to_sequence

    prompt = tiny_target.render("Say hi.")
    ids = [15, 16, 17, 18]
    seq = row_to_sequence({"prompt_text": prompt, "response": "ignored text", "output_ids": ids}, tiny_target, 512, "x")
    assert seq is not None and seq.ids == tiny_target.encode(prompt) + ids
    assert seq.response_start == len(tiny_target.encode(prompt))


def test_greedy_chain_mask_keeps_a_block_position_while_the_answer_took_the_greedy_token_before_it():
    from adaflash.train.dflash import greedy_chain_mask

    greedy = torch.tensor([[[0, 11, 12, 13, 14, 15]]])
    answer = torch.tensor([[[9, 11, 99, 13, 14, 15]]])  # departs from greedy at position 2
    # the anchor and position 1 always; 2 follows position 1 (greedy); 3 onwards come after the departure
    assert greedy_chain_mask(answer, greedy).tolist() == [[[True, True, True, False, False, False]]]
    assert greedy_chain_mask(greedy.clone(), greedy).all()


def test_greedy_chain_learns_greedy_tokens_and_nothing_past_a_departure(learnable, regen, monkeypatch):
    """Rows that depart from the target's greedy choice (as answers sampled at T > 0 do): every learned
    label is the target's greedy token, and no block learns a position after one of its departures."""
    import adaflash.train.dflash as dflash
    from adaflash.models.drafter_io import new_drafter
    from adaflash.train.data import pad
    from adaflash.train.features import FeatureMemo, target_features

    target = learnable.model
    sequences = load_sequences(regen, learnable, 256)[:6]
    gen = torch.Generator().manual_seed(5)
    for s in sequences:  # a departure at about every fifth answer token
        for i in range(s.response_start + 1, len(s.ids)):
            if torch.rand((), generator=gen) < 0.2:
                s.ids[i] = int(torch.randint(target.cfg.vocab_size, (), generator=gen))
    ids, lens, starts = pad(sequences, torch.device("cpu"))
    _, final = target_features(target, ids, [1], with_last=True)
    greedy = target.logits(final).argmax(-1)  # [b, S]: the greedy token after each position
    seen = {}
    real = dflash.distill_loss

    def spy(student, labels, teacher, weights, cfg):
        seen["labels"] = labels
        return real(student, labels, teacher, weights, cfg)

    def learned(chain: bool) -> list[int]:
        """The labels one loss call learns, in block order."""
        drafter = new_drafter("dflash", target.cfg, block_size=6, seed=1)
        memo = FeatureMemo(target, drafter.target_layer_ids, keep_greedy=chain)
        monkeypatch.setattr(dflash, "distill_loss", spy)
        dflash.dflash_loss(drafter, target, ids, lens, starts, blocks_per_seq=8,
                           loss_cfg=LossConfig("ce", greedy_chain=chain), gen=torch.Generator().manual_seed(0),
                           features=memo.source([id(s) for s in sequences]))
        return seen["labels"].tolist()

    anchors = dflash.sample_anchors(lens, starts, 8, torch.Generator().manual_seed(0)).anchors
    plain, chained = learned(False), learned(True)
    # the positions the chain keeps, rebuilt here from the rows: block k of anchor a is kept while
    # ids[a+1..a+k-1] are the greedy tokens, and learns greedy[a+k-1]
    expected = []
    for row, length in enumerate(lens.tolist()):
        for a in anchors[row].unique().tolist():
            for k in range(1, 6):
                p = a + k
                if p >= length:
                    break
                expected.append(int(greedy[row, p - 1]))
                if int(ids[row, p]) != int(greedy[row, p - 1]):
                    break
    assert chained == expected
    assert len(chained) < len(plain)  # the departures cut blocks short


def test_block_acceptance_counts_hits_to_the_first_miss_and_knows_when_a_chain_hides_the_rest():
    from adaflash.train.dflash import block_acceptance

    t, f = True, False
    hit = torch.tensor([[[t, t, f, t], [t, t, f, f], [t, f, t, t]]])
    in_block = torch.ones(1, 3, 4, dtype=torch.bool)
    learned = torch.tensor([[[t, t, t, t], [t, t, f, f], [t, t, f, f]]])  # blocks 2 and 3: chains of 2
    accepted, known = block_acceptance(hit, in_block, learned, torch.ones(1, 3, dtype=torch.bool),
                                       torch.tensor([[10, 10, 1]]))
    assert accepted.tolist() == [[2, 2, 1]]  # the third block's row has one token left
    # block 2 hit its whole chain, which ended before the block: how far it would go is unseen
    assert known.tolist() == [[True, False, True]]


class Ticking:
    """A clock that advances `tick` seconds at each reading: a training step then lasts a known time."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def _rates(trainer: Trainer, sequences) -> list[float]:
    rates: list[float] = []
    trainer.run(sequences, on_step=lambda step, total, stats: rates.append(stats["lr"]))
    return rates


def test_a_time_budget_ends_the_learning_rate_schedule_annealed_and_a_resumed_leg_continues_it(
        tmp_path, learnable, regen):
    """A run cut by --max-minutes long before its last step must not stop at its peak rate; split into
    legs over one --schedule-minutes, the second leg picks the cosine up where the first left it."""
    sequences = load_sequences(regen, learnable, 256)
    cut = Trainer(_cfg(tmp_path / "cut", steps=1000, warmup_steps=0, max_minutes=1.0), learnable)
    cut.clock = Ticking(10.0)  # one reading a step: 10 s a step, so 6 steps fill the minute
    rates = _rates(cut, sequences)
    assert len(rates) == 6 and cut.state.seconds == pytest.approx(60.0)
    assert rates == sorted(rates, reverse=True) and rates[0] == pytest.approx(2e-3)
    assert rates[-1] == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 60))))
    assert load_drafter(tmp_path / "cut" / "d").state_dict().keys()  # saved at the budget's end

    legs = dict(steps=1000, warmup_steps=0, max_minutes=1.0, schedule_minutes=2.0)
    first = Trainer(_cfg(tmp_path / "legs", **legs), learnable)
    first.clock = Ticking(10.0)
    first_rates = _rates(first, sequences)
    second = Trainer(_cfg(tmp_path / "legs", resume=True, **legs), learnable)
    second.clock = Ticking(10.0)
    second_rates = _rates(second, sequences)
    assert second.state.seconds == pytest.approx(120.0) and second.state.step == 12
    both = first_rates + second_rates
    assert both == sorted(both, reverse=True)  # one cosine over both legs: no jump back to the peak
    assert second_rates[0] == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 60 / 120))))


def test_without_a_time_budget_the_schedule_follows_the_steps(tmp_path, learnable, regen):
    trainer = Trainer(_cfg(tmp_path, steps=5, warmup_steps=0), learnable)
    trainer.clock = Ticking(1000.0)  # however slow its steps, a run without --max-minutes runs them all
    rates = _rates(trainer, load_sequences(regen, learnable, 256))
    assert len(rates) == 5 and rates[-1] == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 5))))


def test_several_data_files_train_as_one_corpus_and_a_bad_one_is_named(tmp_path, learnable, regen):
    rows = regen.read_text().splitlines()
    first, second = tmp_path / "greedy.jsonl", tmp_path / "sampled.jsonl"
    first.write_text("\n".join(rows[:5]) + "\n")
    second.write_text("\n".join(rows[5:]) + "\n")
    both = load_sequences([first, second], learnable, 256)
    assert [s.ids for s in both] == [s.ids for s in load_sequences(regen, learnable, 256)]
    assert len(load_sequences([first, second], learnable, 256, limit=7)) == 7

    ws = tmp_path / "ws"
    base = ["--workspace", str(ws), "train", "draft", "--method", "dflash", "--target", str(learnable.folder),
            "--steps", "1", "--block-size", "8", "--blocks-per-seq", "2", "--eval-prompts", "0"]
    result = CliRunner().invoke(cli, [*base, "--data", str(first), "--data", str(second), "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    from adaflash.runlog import RunLog

    run = RunLog.open(ws).list_runs(kind="train")[0]
    assert run["config"]["sequences"] == len(rows) and run["dataset"] == f"{first},{second}"
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"prompt_text": "x", "response": ""}\n')
    result = CliRunner().invoke(cli, [*base, "--data", str(first), "--data", str(empty), "--out", str(tmp_path / "e")])
    assert result.exit_code == 2 and "empty.jsonl: no usable training rows" in result.output
    result = CliRunner().invoke(cli, [*base, "--data", str(first), "--data", str(tmp_path / "missing.jsonl"),
                                      "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "missing.jsonl" in result.output


def test_a_time_budgeted_run_shows_the_step_its_budget_will_end_at():
    from adaflash.cli.train import steps_in_budget

    assert steps_in_budget(100, 100_000, 0, 60.0, 10.0) == 1000  # 100 steps a minute, 10 minutes
    assert steps_in_budget(150, 100_000, 100, 30.0, 1.0) == 200  # a resumed leg counts its own steps
    assert steps_in_budget(100, 500, 0, 60.0, 10.0) == 500  # --steps ends it first
    assert steps_in_budget(100, 100_000, 0, 900.0, 10.0) == 100  # past the budget: it stops now
    assert steps_in_budget(0, 7, 0, 0.0, 10.0) == 7  # no step yet: no pace to go by


def test_batches_group_rows_of_like_length_and_keep_every_row_once():
    from adaflash.train.data import Sequence, batches, epoch_order

    gen = torch.Generator().manual_seed(3)
    sequences = [Sequence([1] * int(n), 0) for n in torch.randint(8, 400, (900,), generator=gen)]
    order = epoch_order(len(sequences), 0, 0)
    grouped = batches(order, sequences, 2048, seed=5)
    assert sorted(i for b in grouped for i in b) == list(range(len(sequences)))
    assert all(max(len(sequences[i].ids) for i in b) * len(b) <= 2048 for b in grouped)
    assert grouped == batches(order, sequences, 2048, seed=5)  # a function of the order and the seed: resumable
    assert grouped != batches(order, sequences, 2048, seed=6)

    def padding(groups):
        return sum(max(len(sequences[i].ids) for i in b) * len(b) - sum(len(sequences[i].ids) for i in b)
                   for b in groups)

    plain = []  # the epoch order cut as it comes
    for index in order:
        if plain and max(len(sequences[i].ids) for i in plain[-1] + [index]) * (len(plain[-1]) + 1) <= 2048:
            plain[-1].append(index)
        else:
            plain.append([index])
    assert padding(grouped) < padding(plain) / 4


def test_anchors_are_distinct_response_positions_and_a_row_without_any_gets_one():
    from adaflash.train.dflash import sample_anchors

    lens, starts = torch.tensor([40, 3, 2, 12]), torch.tensor([5, 3, 1, 4])
    blocks = sample_anchors(lens, starts, 6, torch.Generator().manual_seed(0))
    for row, (n, start) in enumerate(zip(lens.tolist(), starts.tolist())):
        mine = blocks.anchors[row][blocks.valid[row]].tolist()
        if n - 1 > start:
            assert mine == sorted(set(mine)) and all(start <= a < n - 1 for a in mine)
            assert len(mine) == min(6, n - 1 - start)
        else:
            assert mine == [max(n - 2, 0)]
    again = sample_anchors(lens, starts, 6, torch.Generator().manual_seed(0))
    assert torch.equal(again.anchors, blocks.anchors)


def test_stack_padded_places_each_row_and_zeros_after_it():
    from adaflash.train.features import stack_padded

    rows = [torch.arange(6.0).view(3, 2), torch.ones(1, 2), torch.full((4, 2), 7.0)]
    out = stack_padded(rows, 5)
    assert out.shape == (3, 5, 2)
    for row, values in enumerate(rows):
        assert torch.equal(out[row, : len(values)], values) and not out[row, len(values):].any()


def test_resume_refuses_a_checkpoint_of_another_drafter(tmp_path, learnable, regen):
    sequences = load_sequences(regen, learnable, 256)
    Trainer(_cfg(tmp_path, steps=1), learnable).run(sequences)
    assert (tmp_path / "d-train" / "checkpoint.json").is_file()
    deeper = Trainer(_cfg(tmp_path, steps=2, resume=True, layers=2), learnable)
    with pytest.raises(ValueError, match="holds another drafter than this run builds"):
        deeper.run(sequences)


def test_promote_replaces_a_drafter_only_when_held_out_prompts_show_it_drafts_better(tmp_path, learnable, regen):
    from adaflash.models.drafter_io import new_drafter, save_drafter
    from adaflash.runlog import RunLog

    trained = tmp_path / "trained"
    Trainer(_cfg(tmp_path, out=str(trained), steps=20, lr=3e-3), learnable).run(load_sequences(regen, learnable, 256))
    shipped = tmp_path / "shipped"
    save_drafter(new_drafter("dflash", learnable.model.cfg, block_size=8, seed=1), shipped, {"target": "tiny"})
    (shipped / "README.md").write_text("model card\n")
    before = (shipped / "model.safetensors").read_bytes()
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"Tell me about the number {i}.", "domain": d}) + "\n"
                            for d, numbers in (("low", range(20, 23)), ("high", range(40, 43))) for i in numbers))
    ws = tmp_path / "ws"
    base = ["--workspace", str(ws), "train", "promote", "--target", str(learnable.folder), "--device", "cpu",
            "--dataset", str(held), "--num-prompts", "3", "--max-new-tokens", "24", "--over", str(shipped)]
    fresh = tmp_path / "fresh"
    save_drafter(new_drafter("dflash", learnable.model.cfg, block_size=8, seed=2), fresh, {"target": "tiny"})
    result = CliRunner().invoke(cli, [*base, str(fresh)])
    assert result.exit_code == 1 and f"kept {shipped}" in result.output, result.output
    result = CliRunner().invoke(cli, [*base, str(trained), "--dry-run"])
    assert result.exit_code == 0 and "would promote" in result.output, result.output
    assert (shipped / "model.safetensors").read_bytes() == before
    result = CliRunner().invoke(cli, [*base, str(trained)])
    assert result.exit_code == 0 and "promoted" in result.output, result.output
    assert "low" in result.output and "high" in result.output  # τ of each domain, side by side
    got, want = load_drafter(shipped).state_dict(), load_drafter(trained).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert (shipped / "README.md").read_text() == "model card\n"
    runs = [r for r in RunLog.open(ws).list_runs(kind="train") if r["name"] == "promote"]
    assert sorted(r["note"].split(":")[0] for r in runs) == ["kept", "promoted", "would promote"]
