"""tracevllm: vLLM V1's inference engine, rebuilt to be read, run and watched.

``LLM``, ``SamplingParams``, ``RequestOutput``, ``CompletionOutput`` and the prompt types
(``PromptType``, ``TextPrompt``, ``TokensPrompt``, from tracevllm.inputs) are imported on first use,
so that importing a light part of the package (``tracevllm.tracing.schema``, which ``viz`` reads)
does not load torch and the engine.
"""

import importlib

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "PromptType", "TextPrompt", "TokensPrompt"]
__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "tracevllm.entrypoints.llm",
    "SamplingParams": "tracevllm.sampling_params",
    "RequestOutput": "tracevllm.outputs",
    "CompletionOutput": "tracevllm.outputs",
    "PromptType": "tracevllm.inputs",
    "TextPrompt": "tracevllm.inputs",
    "TokensPrompt": "tracevllm.inputs",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tracevllm' has no attribute {name!r}")
