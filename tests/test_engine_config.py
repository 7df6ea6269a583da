"""One EngineConfig: validated, sent as JSON, and the same options on every command that builds an engine."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from adaflash.cli.main import cli
from adaflash.engine.config import EngineConfig, engine_rules

ENGINE_COMMANDS = (["serve"], ["generate"], ["eval"], ["bench", "engine"], ["pipeline"])


@pytest.mark.parametrize("field, value, expected", [
    ("length_rate", 0, "length_rate must be a number > 0, got 0"),
    ("min_length", 0, "min_length must be an integer >= 1, got 0"),
    ("max_batch", True, "max_batch must be an integer >= 1, got True"),
    ("length_policy", "fast", "length_policy must be one of cost, rate, got 'fast'"),
    ("admit_batch", 0, "admit_batch must be an integer >= 1 or null, got 0"),
    ("overlap", "yes", "overlap must be true or false or null, got 'yes'"),
    ("length_rate", float("nan"), "length_rate must be a number > 0, got nan"),
])
def test_a_bad_setting_names_the_field_and_what_it_takes(field, value, expected):
    with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
        EngineConfig(**{field: value})


def test_it_travels_as_json_and_refuses_fields_it_does_not_have():
    config = EngineConfig(max_batch=4, length_rate=2, overlap=False, admit_batch=2)
    assert config.length_rate == 2.0 and isinstance(config.length_rate, float)
    assert EngineConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    with pytest.raises(ValueError, match="unknown field.*turbo"):
        EngineConfig.from_json({"turbo": True})


@pytest.mark.parametrize("command", ENGINE_COMMANDS, ids=" ".join)
def test_every_engine_command_offers_the_same_engine_options(command):
    result = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    # bench engine sizes its engines by --batch-sizes and each prompt; the pipeline trains DFlash drafters only
    skipped = {"bench engine": {"max_len", "max_batch"}, "pipeline": {"num_steps"}}.get(" ".join(command), set())
    for name, rule in engine_rules().items():
        if rule.flag and name not in skipped:
            assert rule.flag.split("/")[0] in result.output, (command, rule.flag)


def test_the_pipeline_hands_every_engine_option_to_its_inference_worker(tmp_path):
    """The pipeline used to fix the length rate, the overlap and the admission batch of its engine."""
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), "pipeline", "--draft", "smollm2-135m-dflash",
                                      "--data", str(tmp_path / "p.jsonl"), "--batch-size", "8", "--length-rate", "1.5",
                                      "--min-length", "3", "--admit-batch", "2", "--no-overlap", "--seed", "7",
                                      "--dry-run"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("inference:"))
    payload = json.loads(line[line.index("'{") + 1: line.rindex("}'") + 1])
    assert EngineConfig.from_json(payload["engine"]) == EngineConfig(max_batch=8, length_rate=1.5, min_length=3,
                                                                     admit_batch=2, overlap=False, seed=7)


def test_a_bad_value_is_refused_by_the_option_before_anything_loads(tmp_path):
    for command in (["generate", "--prompt", "hi"], ["serve", "--dry-run"]):
        result = CliRunner().invoke(cli, ["--workspace", str(tmp_path / "ws"), *command, "--length-rate", "-1"])
        assert result.exit_code == 2 and "--length-rate" in result.output, result.output
