"""`adaflash models synth`: real architectures with seeded random weights, loadable wherever a target is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from adaflash.cli.main import cli
from adaflash.models import synth
from adaflash.models.layers import DecoderConfig, Rotary


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


@pytest.fixture(scope="module")
def tiny_synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "qwen3-tiny"
    argv = ["models", "synth", "qwen3-tiny", "--out", str(out), "--seed", "7", "--json"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)
    assert written["architecture"] == "qwen3-tiny" and written["seed"] == 7 and written["layers"] == 4
    assert written["dtype"] == "bfloat16" and written["device"] == "cpu"
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors", synth.MARKER} <= set(written["files"])
    return out


def test_tiny_synth_loads_as_a_target_with_a_chat_template(tiny_synth):
    from adaflash.models.loading import load_target

    target = load_target(str(tiny_synth), device="cpu", dtype="float32")
    config = json.loads((tiny_synth / "config.json").read_text())
    table = synth.ARCHS["qwen3-tiny"].config
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rope_theta", "rms_norm_eps",
                "max_position_embeddings", "tie_word_embeddings"):
        assert config[key] == table[key], key
    cfg = target.model.cfg
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("qwen3", 4, 128, 1024)
    assert cfg.qk_norm and not cfg.tie_word_embeddings
    text = target.render("hi")
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    ids = target.encode(text)
    assert ids and max(ids) < cfg.vocab_size
    assert target.decode(target.encode("héllo, wörld")) == "héllo, wörld"
    im_end = target.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert target.eos_ids[0] == im_end and im_end in ids
    state = _weights(tiny_synth)
    assert all(t.dtype == torch.bfloat16 for t in state.values())
    assert torch.equal(state["model.norm.weight"], torch.ones(128, dtype=torch.bfloat16))
    assert 0.015 < state["model.layers.0.mlp.up_proj.weight"].float().std().item() < 0.025
    cache = target.model.new_cache(1, 64)
    logits, _ = target.model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, torch.tensor([0]))
    assert torch.isfinite(logits).all()


def test_synth_is_deterministic_for_a_seed(tmp_path, tiny_synth):
    again = synth.write_synth("qwen3-tiny", tmp_path / "again", seed=7)
    other = synth.write_synth("qwen3-tiny", tmp_path / "other", seed=8)
    shallow = synth.write_synth("qwen3-tiny", tmp_path / "shallow", seed=7, layers=2)
    first, second, third = _weights(tiny_synth), _weights(again.out), _weights(other.out)
    assert first.keys() == second.keys() == third.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], third["model.embed_tokens.weight"])
    # each tensor's values follow from the seed and its name: fewer layers are the first layers of the model
    fewer = _weights(shallow.out)
    assert shallow.layers == 2 and not any(k.startswith("model.layers.2.") for k in fewer)
    assert all(torch.equal(fewer[k], first[k]) for k in fewer)


def test_unknown_architecture_names_the_choices(tmp_path):
    result = CliRunner().invoke(cli, ["models", "synth", "qwen3-30b-a3b", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "unknown architecture 'qwen3-30b-a3b'" in result.output
    assert all(name in result.output for name in synth.ARCHS)
    assert "mixture-of-experts" in result.output
    assert not (tmp_path / "x").exists()


def test_out_folder_is_new_empty_or_an_earlier_synth(tmp_path, tiny_synth):
    runner = CliRunner()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine\n")
    result = runner.invoke(cli, ["models", "synth", "qwen3-tiny", "--out", str(busy)])
    assert result.exit_code == 2 and "not a synthetic model" in result.output
    assert (busy / "notes.txt").read_text() == "mine\n"
    done = tmp_path / "done"
    assert runner.invoke(cli, ["models", "synth", "llama-tiny", "--out", str(done)]).exit_code == 0
    result = runner.invoke(cli, ["models", "synth", "llama-tiny", "--out", str(done)])
    assert result.exit_code == 2 and "--force" in result.output
    result = runner.invoke(cli, ["models", "synth", "qwen3-tiny", "--out", str(done), "--force"])
    assert result.exit_code == 0, result.output
    assert json.loads((done / "config.json").read_text())["model_type"] == "qwen3"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


def test_shards_come_with_an_index_and_load_alike(tmp_path, tiny_synth):
    from adaflash.models.target import load_target_model

    result = synth.write_synth("qwen3-tiny", tmp_path / "sharded", seed=7, max_shard_bytes=600_000)
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) >= 3 and shards[0].name == f"model-00001-of-{len(shards):05d}.safetensors"
    assert all(shard.stat().st_size <= 600_000 + 10_000 for shard in shards)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == result.bytes
    assert set(index["weight_map"]) == set(_weights(tiny_synth)) and set(index["weight_map"].values()) == {
        s.name for s in shards}
    one, many = load_target_model(tiny_synth), load_target_model(tmp_path / "sharded")
    ids = torch.tensor([[1, 2, 3, 4]])
    outs = [m(ids, torch.arange(4)[None], m.new_cache(1, 16), torch.tensor([0]))[0] for m in (one, many)]
    assert torch.equal(outs[0], outs[1])


def test_llama_tiny_matches_transformers_with_llama3_rope(tmp_path):
    from transformers import AutoModelForCausalLM

    from adaflash.models.loading import load_target

    out = synth.write_synth("llama-tiny", tmp_path / "llama", seed=3).out
    target = load_target(str(out), device="cpu", dtype="float32")
    assert target.model.cfg.rope_scaling["rope_type"] == "llama3"
    text = target.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                           "Be brief.<|eot_id|>")
    ids = target.encode(text)
    assert target.eos_ids[0] == target.tokenizer.convert_tokens_to_ids("<|eot_id|>")
    reference = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits
    ours, _ = target.model(torch.tensor([ids]), torch.arange(len(ids))[None], target.model.new_cache(1, 64),
                           torch.tensor([0]))
    assert torch.allclose(ours, expected, atol=1e-4)


def test_8b_configs_are_the_real_shapes():
    qwen = synth.synth_config("qwen3-8b")
    expected = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "intermediate_size": 12288,
                "vocab_size": 151936, "tie_word_embeddings": False, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
                "max_position_embeddings": 40960}
    assert {k: qwen[k] for k in expected} == expected
    assert DecoderConfig.from_hf(qwen).qk_norm
    llama = synth.synth_config("llama-3.1-8b")
    expected = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "intermediate_size": 14336,
                "vocab_size": 128256, "tie_word_embeddings": False, "rope_theta": 5e5}
    assert {k: llama[k] for k in expected} == expected
    cfg = DecoderConfig.from_hf(llama)
    assert cfg.rope_scaling and (cfg.rope_scaling["rope_type"], cfg.rope_scaling["factor"]) == ("llama3", 8.0)
    assert Rotary(cfg).inv_freq.shape == (64,)  # the engine builds Llama 3.1's scaled frequencies
    for name, billions in (("qwen3-8b", 8.19), ("llama-3.1-8b", 8.03)):
        plan = synth.tensor_plan(synth.synth_config(name))
        assert round(sum(t.numel for t in plan) / 1e9, 2) == billions
        assert "lm_head.weight" in {t.name for t in plan}  # untied: its own 1.2 GB
        shards = synth.shard_plan(plan, 2, synth.MAX_SHARD_BYTES)
        assert len(shards) == 5 and all(sum(t.numel for t in s) * 2 <= synth.MAX_SHARD_BYTES for s in shards)
    four = synth.synth_config("qwen3-8b", layers=4)
    assert four["num_hidden_layers"] == four["max_window_layers"] == 4 and four["hidden_size"] == 4096
    with pytest.raises(synth.SynthError, match="--layers"):
        synth.synth_config("qwen3-8b", layers=0)


def test_models_list_shows_the_synth_architectures():
    result = CliRunner().invoke(cli, ["models", "list", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert {r["name"] for r in rows if r["kind"] == "synth"} == set(synth.ARCHS)
    assert any(r["kind"] == "builtin" and r["name"] == "smollm2-135m" for r in rows)


def test_the_smollm2_shapes_are_the_built_in_targets(smollm2_folder):
    """A GPU host without the built-in's weights measures its speed on these: every shape must be the real one."""
    real = json.loads((smollm2_folder / "config.json").read_text())
    made = synth.synth_config("smollm2-135m")
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "tie_word_embeddings", "model_type", "head_dim")
    assert {k: made[k] for k in keys} == {k: real[k] for k in keys}
    assert made["rope_theta"] == real["rope_parameters"]["rope_theta"] and made["rope_scaling"] is None
    plan = synth.tensor_plan(made)
    assert "lm_head.weight" not in {t.name for t in plan}  # tied, as the real one
    assert round(sum(t.numel for t in plan) / 1e6, 1) == 134.5
