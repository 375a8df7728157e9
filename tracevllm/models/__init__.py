"""Model implementations (Llama family, Qwen2, Qwen3) and their loading."""
