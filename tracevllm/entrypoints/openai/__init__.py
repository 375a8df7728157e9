"""The OpenAI-compatible HTTP server: `tracevllm serve`."""
