"""The built-in drafter: a name that resolves to the folder shipped inside adaflash, everywhere a
drafter folder is accepted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.data.prompts import PromptFileError, read_prompt_file
from adaflash.models.builtin_drafters import BUILTIN_DRAFTERS
from adaflash.models.drafter_io import load_drafter
from adaflash.models.drafters import DFlashDrafter
from adaflash.models.registry import resolve_drafter


@pytest.mark.parametrize(("name", "layers", "block"), [("smollm2-135m-dflash", 1, 4), ("smollm2-135m-general", 3, 8)])
def test_the_builtin_drafters_load_by_name_with_their_length_heads(name, layers, block):
    drafter = load_drafter(name)
    assert isinstance(drafter, DFlashDrafter)
    assert drafter.block_size == block and drafter.length_head is not None and len(drafter.layers) == layers
    assert resolve_drafter(name) == BUILTIN_DRAFTERS[name].folder
    assert (BUILTIN_DRAFTERS[name].folder / "README.md").is_file()  # where its weights came from


def test_a_name_that_is_not_builtin_stays_a_path(tmp_path):
    assert resolve_drafter(str(tmp_path / "mine")) == tmp_path / "mine"


def test_draft_builtins_lists_it_as_installed():
    result = CliRunner().invoke(cli, ["draft", "builtins", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)}
    for name in ("smollm2-135m-dflash", "smollm2-135m-general"):
        assert rows[name]["installed"] is True and rows[name]["target"] == "smollm2-135m"
    assert rows["smollm2-135m-general"]["default_for"] == "dflash,adaflash"
    assert rows["smollm2-135m-dflash"]["default_for"] == ""  # the GSM8K specialist: by name only


def test_train_init_names_the_option_when_the_drafter_does_not_exist(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps({"prompt": "q"}) + "\n")
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path), "train", "draft", "--method", "dflash",
                                      "--data", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o"),
                                      "--init", "no-such-drafter"])
    assert result.exit_code == 2
    assert "--init" in result.output and "no-such-drafter" in result.output


def test_prompt_files_skip_leading_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(5)))
    assert [r.prompt for r in read_prompt_file(path, 2, skip=2)] == ["q2", "q3"]
    with pytest.raises(PromptFileError, match="none left after skipping 5"):
        read_prompt_file(path, skip=5)


def test_the_drafter_recipe_exports_the_trained_drafter_in_bf16(tmp_path):
    """`adaflash run smollm2-drafter-h200` ends by writing what ships in adaflash/drafters/: the same
    drafter, its floating-point weights in bf16, loading like the built-in one."""
    import subprocess

    import torch
    from safetensors.torch import load_file

    from adaflash.models.drafter_io import save_drafter
    from jobs.recipe import load_recipe

    source = load_drafter("smollm2-135m-dflash")
    save_drafter(source.float(), tmp_path / "run" / "dflash-more", {"target": "smollm2-135m"})
    recipe = load_recipe("smollm2-drafter-h200", context={"run_id": "R", "run_dir": str(tmp_path / "run"),
                                                          "workspace": str(tmp_path)})
    done = subprocess.run(recipe.jobs["export"].argv(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    exported = load_file(str(tmp_path / "run" / "export" / "model.safetensors"))
    assert {v.dtype for v in exported.values() if v.is_floating_point()} == {torch.bfloat16}
    again = load_drafter(tmp_path / "run" / "export")
    for (name, a), (_, b) in zip(source.state_dict().items(), again.state_dict().items()):
        torch.testing.assert_close(a.float(), b.float(), msg=name)


def test_draft_export_copies_checked_drafters_byte_for_byte_or_cast(tmp_path):
    import torch
    from safetensors.torch import load_file

    source = resolve_drafter("smollm2-135m-dflash")
    result = CliRunner().invoke(cli, ["draft", "export", "smollm2-135m-dflash", "--out", str(tmp_path / "copy")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()
    result = CliRunner().invoke(cli, ["draft", "export", str(tmp_path / "copy"), "--out", str(tmp_path / "f32"),
                                      "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    cast = load_file(str(tmp_path / "f32" / "model.safetensors"))
    assert {v.dtype for v in cast.values() if v.is_floating_point()} == {torch.float32}
    assert torch.equal(cast["fc.weight"].bfloat16(), load_file(str(source / "model.safetensors"))["fc.weight"])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    result = CliRunner().invoke(cli, ["draft", "export", str(tmp_path / "broken"), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "broken/config.json" in result.output and not (tmp_path / "x").exists()
    result = CliRunner().invoke(cli, ["draft", "export", str(tmp_path / "copy"), "--out", str(tmp_path / "copy")])
    assert result.exit_code == 2 and "would replace the drafter it reads" in result.output


def test_dflash_and_adaflash_default_to_their_built_in_drafters_of_a_built_in_target(tmp_path):
    """DFlash and AdaFlash run the general drafter (its length head serves AdaFlash); a pipeline starts from it."""
    from adaflash.engine.build import drafter_for

    (tmp_path / "q.jsonl").write_text('{"prompt": "hi"}\n')
    assert drafter_for("dflash", None, "smollm2-135m") == "smollm2-135m-general"
    assert drafter_for("adaflash", None, "smollm2-135m") == "smollm2-135m-general"
    assert drafter_for("adaflash", "mine/", "smollm2-135m") == "mine/"  # --draft wins
    assert drafter_for("vanilla", "mine/", "smollm2-135m") is None
    for method, target in (("osd", "smollm2-135m"), ("eagle3", "smollm2-135m"), ("dflash", "/models/other")):
        with pytest.raises(ValueError, match=f"--method {method} needs --draft"):
            drafter_for(method, None, target)
    result = CliRunner().invoke(cli, ["serve", "--method", "adaflash", "--dry-run", "--gpus", "cpu"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["draft"] == "smollm2-135m-general"
    assert "runs the built-in drafter smollm2-135m-general" in result.stderr

    from adaflash.bench.engine_spec import EngineBenchError, resolve_drafts

    folder = str(resolve_drafter("smollm2-135m-general"))
    assert resolve_drafts(["vanilla", "dflash", "adaflash"], None, {}, "smollm2-135m") == {
        "dflash": folder, "adaflash": folder}
    with pytest.raises(EngineBenchError, match="no drafter for osd"):
        resolve_drafts(["dflash", "osd"], None, {}, "smollm2-135m")
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "pipeline", "--data",
                                      str(tmp_path / "q.jsonl"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f'"draft": "{folder}"' in result.stdout and "starting from the built-in drafter" in result.stderr


def test_written_drafters_get_the_umask_modes_not_the_temp_files_owner_only_ones(tmp_path):
    """mkdtemp and safetensors make 0700 folders and 0600 files: a drafter renamed into place as
    they are could not be read by a server running under another account of the group."""
    import os
    import stat

    from adaflash.data.io import atomic_jsonl

    def modes(folder):
        return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.iterdir()]}

    old = os.umask(0o027)
    try:
        for argv in (["draft", "export", "smollm2-135m-dflash", "--out", str(tmp_path / "copy")],
                     ["draft", "export", "smollm2-135m-dflash", "--out", str(tmp_path / "cast"), "--dtype", "float32"]):
            result = CliRunner().invoke(cli, argv)
            assert result.exit_code == 0, result.output
        with atomic_jsonl(tmp_path / "rows.jsonl") as (writer,):
            writer.write({"prompt": "hi"})
    finally:
        os.umask(old)
    assert modes(tmp_path / "copy") == {"copy": 0o750, "config.json": 0o640, "model.safetensors": 0o640}
    assert modes(tmp_path / "cast") == {"cast": 0o750, "config.json": 0o640, "model.safetensors": 0o640}
    assert stat.S_IMODE((tmp_path / "rows.jsonl").stat().st_mode) == 0o640


def test_a_drafter_is_never_written_over_a_folder_that_is_not_a_drafter(tmp_path):
    """The atomic rename replaced --out whole: exporting into a folder holding notes (or a workspace's
    run log) deleted them."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("precious\n")
    (tmp_path / "rows.jsonl").write_text('{"prompt_text": "hi", "response": "there"}\n')
    for argv in (["draft", "export", "smollm2-135m-dflash", "--out", str(folder)],
                 ["train", "draft", "--method", "dflash", "--data", str(tmp_path / "rows.jsonl"), "--out", str(folder)],
                 ["train", "length-head", "--draft", "smollm2-135m-dflash", "--data", str(tmp_path / "rows.jsonl"),
                  "--out", str(folder)]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 2 and "not a drafter folder (it holds notes.txt)" in result.output, result.output
    assert (folder / "notes.txt").read_text() == "precious\n"
    result = CliRunner().invoke(cli, ["draft", "export", "smollm2-135m-dflash", "--out", str(tmp_path / "copy")])
    assert result.exit_code == 0, result.output
    again = CliRunner().invoke(cli, ["draft", "export", "smollm2-135m-dflash", "--out", str(tmp_path / "copy")])
    assert again.exit_code == 0, again.output  # a drafter may replace a drafter
