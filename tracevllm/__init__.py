"""tracevllm: vLLM V1's inference engine, rebuilt to be read, run and watched."""

from tracevllm.entrypoints.llm import LLM
from tracevllm.outputs import CompletionOutput, RequestOutput
from tracevllm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
