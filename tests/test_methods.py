"""The method table is the one place that says what a method needs; every other place agrees with it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from adaflash.engine.config import EngineConfig
from adaflash.methods import (
    DRAFTER_ARCHITECTURES,
    METHOD_NAMES,
    TABLE,
    UnknownMethodError,
    display_name,
    method_for_algorithm,
    method_of,
    plain_method_for,
    sglang_algorithms,
)


def test_the_table_names_each_method_once_with_the_display_names_people_read():
    assert METHOD_NAMES == ("vanilla", "dflash", "adaflash", "eagle3", "mtp", "osd")
    assert [display_name(m) for m in METHOD_NAMES] == ["Vanilla", "DFlash", "AdaFlash", "EAGLE-3", "MTP", "OSD"]
    assert display_name("hf-generate") == "hf-generate"
    assert DRAFTER_ARCHITECTURES == ("dflash", "eagle3", "mtp")
    assert [m.name for m in TABLE if m.length_head] == ["adaflash"]
    assert {m.name: m.kind for m in TABLE} == {"vanilla": "none", "dflash": "block", "adaflash": "block",
                                               "eagle3": "chain", "mtp": "chain", "osd": "block"}


def test_an_unknown_method_is_refused_with_the_valid_ones_named():
    with pytest.raises(UnknownMethodError, match=r"--methods must be one of vanilla, dflash, .*got 'medusa'"):
        method_of("medusa", "--methods")


def test_drafter_needs_differ_between_the_embedded_engine_and_sglang():
    assert not method_of("vanilla").needs_draft_on("embedded") and not method_of("vanilla").needs_draft_on("sglang")
    assert method_of("mtp").needs_draft_on("embedded") and not method_of("mtp").needs_draft_on("sglang")
    assert all(method_of(m).needs_draft_on("sglang") for m in ("dflash", "adaflash", "osd", "eagle3"))


def test_sglang_algorithms_map_back_to_the_plain_method():
    assert method_for_algorithm(None).name == "vanilla"
    assert method_for_algorithm("dflash").name == "dflash"  # AdaFlash and OSD report DFLASH as well
    assert method_for_algorithm("EAGLE").name == "eagle3" and method_for_algorithm("NEXTN").name == "mtp"
    assert method_for_algorithm("MEDUSA") is None
    assert sglang_algorithms() == ("DFLASH", "EAGLE3", "EAGLE", "NEXTN")
    assert plain_method_for("dflash").name == "dflash" and plain_method_for("eagle3").name == "eagle3"


def test_the_commands_offer_the_table_s_methods():
    from adaflash.cli.main import cli

    for command in (["serve"], ["generate"], ["data", "regenerate"]):
        result = CliRunner().invoke(cli, [*command, "--help"])
        assert "[vanilla|dflash|adaflash|eagle3|mtp|osd]" in result.output, command
    result = CliRunner().invoke(cli, ["draft", "new", "--help"])
    assert "[dflash|eagle3|mtp]" in result.output


def test_the_table_imports_without_torch():
    code = "import sys, adaflash.methods; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_server_info_reports_the_table_s_algorithm(tiny_target):
    from adaflash.engine.engine import Engine
    from adaflash.models.drafter_io import new_drafter
    from adaflash.serve.server import EmbeddedServer

    drafter = new_drafter("dflash", tiny_target.model.cfg, block_size=4, length_head=True)
    for method in ("adaflash", "osd"):
        engine = Engine(tiny_target, method, drafter, config=EngineConfig(max_batch=1, max_len=64))
        info = EmbeddedServer(engine, target="tiny").info()
        assert (info["method"], info["speculative_algorithm"]) == (method, "DFLASH")


def test_an_adaflash_engine_refuses_a_drafter_without_a_length_head(tiny_target):
    from adaflash.engine.engine import Engine
    from adaflash.models.drafter_io import new_drafter

    plain = new_drafter("dflash", tiny_target.model.cfg, block_size=4)
    with pytest.raises(ValueError, match="'adaflash' needs a DFlash drafter with a length head"):
        Engine(tiny_target, "adaflash", plain, config=EngineConfig(max_batch=1, max_len=64))
    headed = Engine(tiny_target, "adaflash", new_drafter("dflash", tiny_target.model.cfg, block_size=4,
                                                         length_head=True), config=EngineConfig(max_batch=1, max_len=64))
    with pytest.raises(ValueError, match="length head"):
        headed.swap_drafter(plain)
