"""What a prompt may be (vLLM's ``vllm.inputs``): a string, a ``TextPrompt`` or a ``TokensPrompt``."""

from tracevllm.inputs.data import PromptType, SingletonPrompt, TextPrompt, TokensPrompt
from tracevllm.inputs.parse import ParsedPrompt, parse_prompts, parse_singleton_prompt

__all__ = [
    "ParsedPrompt", "PromptType", "SingletonPrompt", "TextPrompt", "TokensPrompt", "parse_prompts",
    "parse_singleton_prompt",
]
