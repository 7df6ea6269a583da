"""Shared fixtures: one converted SmolLM2 per machine, tiny random targets per session, a temp workspace."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# One intra-op thread, here and in every process the tests start (CLI runs, servers, recipe jobs): the
# models are tiny, and on a 2-core machine shared with other processes (a second xdist worker, a server
# under test) OpenMP's spinning threads made the engine tests several times slower. Set before torch
# is imported so that the child processes inherit it too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    from adaflash.models.registry import resolve_target

    return Path(resolve_target("smollm2-135m"))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory, smollm2_folder) -> Path:
    from adaflash.models.tiny import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("tiny-llama"), smollm2_folder, model_type="llama")


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory, smollm2_folder) -> Path:
    from adaflash.models.tiny import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("tiny-qwen3"), smollm2_folder, model_type="qwen3", seed=1)


@pytest.fixture(scope="session")
def smollm2_target(smollm2_folder):
    from adaflash.models.loading import load_target

    return load_target(str(smollm2_folder), device="cpu")


@pytest.fixture(scope="session")
def tiny_target(tiny_llama):
    from adaflash.models.loading import load_target

    return load_target(str(tiny_llama), device="cpu")


@pytest.fixture()
def workspace(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ws"
    monkeypatch.setenv("ADAFLASH_WORKSPACE", str(path))
    return path
