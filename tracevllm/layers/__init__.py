"""Model building blocks, tensor-parallel aware (vLLM's model_executor/layers)."""
