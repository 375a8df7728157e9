"""Shared fixtures: the bundled model (converted once per cache directory) and tiny checkpoints."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def bundled_model_dir() -> str:
    from tracevllm.models.loader import bundled_gguf_path, resolve_model

    try:
        bundled_gguf_path()
    except ValueError as e:
        pytest.skip(str(e))
    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, bundled_model_dir):
    """``tiny_checkpoint(arch)`` -> a directory with a tiny random-weight checkpoint of ``arch``."""
    from tests.tiny_checkpoints import make_tiny_checkpoint

    built: dict[str, str] = {}

    def build(arch: str) -> str:
        if arch not in built:
            built[arch] = make_tiny_checkpoint(arch, tmp_path_factory.mktemp(arch), bundled_model_dir)
        return built[arch]

    return build
