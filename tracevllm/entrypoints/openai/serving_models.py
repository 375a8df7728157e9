"""OpenAIServingModels: the names this server answers to, and ``GET /v1/models``."""

from __future__ import annotations

from tracevllm.config import ModelConfig
from tracevllm.entrypoints.openai.protocol import ModelCard, ModelList


class OpenAIServingModels:
    def __init__(self, model_config: ModelConfig) -> None:
        self.served_model_names = model_config.served_model_names or [model_config.served_model_name]
        self.model_path = model_config.model
        self.max_model_len = model_config.max_model_len

    @property
    def base_model_name(self) -> str:
        return self.served_model_names[0]

    def is_base_model(self, name: str) -> bool:
        return name in self.served_model_names

    def show_available_models(self) -> ModelList:
        return ModelList(data=[
            ModelCard(id=name, root=self.model_path, max_model_len=self.max_model_len)
            for name in self.served_model_names
        ])
