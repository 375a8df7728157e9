"""Llama (Llama 2/3, SmolLM2, TinyLlama, Mistral): the decoder that Qwen2 and Qwen3 build on.

Shapes are flattened: the step's tokens of every request form one ``[num_tokens, hidden]`` batch;
only attention needs to know where one request ends (``attn_metadata``). Each decoder layer carries
the residual stream next to the hidden states so that the residual add fuses into RMSNorm.

With pipeline parallelism each stage builds only its slice of the layers (``models/utils.py`` draws
it): a stage that is not the last returns the residual stream as ``IntermediateTensors``, and a stage
that is not the first starts from the ones the previous stage sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

import torch
from torch import nn

from tracevllm.attention.backends.abstract import AttentionBackend, AttentionMetadata
from tracevllm.attention.layer import Attention
from tracevllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_world_size
from tracevllm.layers.activation import SiluAndMul
from tracevllm.layers.layernorm import RMSNorm
from tracevllm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    copy_checked,
)
from tracevllm.layers.rotary_embedding import get_rope, get_rope_parameters
from tracevllm.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from tracevllm.models.utils import IntermediateTensors, PPMissingLayer, make_layers, missing_module_prefixes


def sliding_window_for_layer(config, layer_idx: int) -> int | None:
    """The layer's attention window (in tokens, the query's own included), or None for full attention.

    As transformers decides it: where the config lists ``layer_types`` (Qwen2/Qwen3 derive them from
    ``use_sliding_window`` and ``max_window_layers``), the layers marked "sliding_attention"; otherwise
    (Mistral, older Qwen2 configs) every layer from ``max_window_layers`` (absent: 0) on, unless
    ``use_sliding_window`` is false. Llama configs have no ``sliding_window``: always None.
    """
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if layer_types[layer_idx] == "sliding_attention" else None
    if not getattr(config, "use_sliding_window", True):
        return None
    if layer_idx < getattr(config, "max_window_layers", 0):
        return None
    return window


class LlamaMLP(nn.Module):
    """The gated SiLU MLP: ``down(silu(x W_gate^T) * (x W_up^T))``, gate and up in one GEMM."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    @staticmethod
    def projection_biases(config) -> tuple[bool, bool]:
        """(bias on q/k/v, bias on o): both follow ``attention_bias`` in Llama and Qwen3."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias

    def __init__(self, config, layer_idx: int, attn_backend: type[AttentionBackend]) -> None:
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        hidden_size = config.hidden_size
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // config.num_attention_heads
        qkv_bias, o_bias = self.projection_biases(config)
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, config.num_attention_heads, config.num_key_value_heads, bias=qkv_bias
        )
        self.o_proj = RowParallelLinear(config.num_attention_heads * self.head_dim, hidden_size, bias=o_bias)
        self.num_heads = self.qkv_proj.num_heads  # of this rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        assert self.num_heads * tp_size == config.num_attention_heads
        self.rotary_emb = get_rope(self.head_dim, config.max_position_embeddings, get_rope_parameters(config))
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, attn_backend,
                              sliding_window_for_layer(config, layer_idx))

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k  # Qwen3 normalises each head here

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, attn_metadata: AttentionMetadata):
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.qk_norm(q, k)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, attn_metadata))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, attn_backend, attention_cls: type[LlamaAttention]) -> None:
        super().__init__()
        self.self_attn = attention_cls(config, layer_idx, attn_backend)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, getattr(config, "mlp_bias", False))
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual, attn_metadata):
        if residual is None:
            residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    def __init__(self, config, attn_backend, attention_cls: type[LlamaAttention]) -> None:
        super().__init__()
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first_rank, pp.is_last_rank
        self.embed_tokens = (VocabParallelEmbedding(config.vocab_size, config.hidden_size) if self.is_first_stage
                             else PPMissingLayer())
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, lambda i: LlamaDecoderLayer(config, i, attn_backend, attention_cls)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if self.is_last_stage else PPMissingLayer()

    def forward(self, input_ids, positions, attn_metadata,
                intermediate_tensors: IntermediateTensors | None = None) -> torch.Tensor | IntermediateTensors:
        """The final hidden states on the last stage; the residual stream for the next stage on
        the others. The first stage embeds ``input_ids``; the others start from ``intermediate_tensors``."""
        if self.is_first_stage:
            hidden_states, residual = self.embed_tokens(input_ids), None
        else:
            assert intermediate_tensors is not None
            hidden_states, residual = intermediate_tensors.hidden_states, intermediate_tensors.residual
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual, attn_metadata)
        if not self.is_last_stage:
            return IntermediateTensors(hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    attention_cls: type[LlamaAttention] = LlamaAttention
    # checkpoint name -> (our fused parameter, shard id)
    stacked_params = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config, attn_backend: type[AttentionBackend]) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, attn_backend, self.attention_cls)
        last_stage, first_stage = self.model.is_last_stage, self.model.is_first_stage
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size) if last_stage else PPMissingLayer()
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings and last_stage and first_stage:
            self.lm_head.tie_weights(self.model.embed_tokens)
        # Tied, on a last stage that is not the first (no embedding here): the LM head loads the
        # checkpoint's embedding weight itself.
        self.lm_head_from_embedding = self.tie_word_embeddings and last_stage and not first_stage
        self.missing_prefixes = missing_module_prefixes(self)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata,
                intermediate_tensors: IntermediateTensors | None = None) -> torch.Tensor | IntermediateTensors:
        return self.model(input_ids, positions, attn_metadata, intermediate_tensors)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face checkpoint tensors in (converting their dtype), fusing q/k/v into
        ``qkv_proj`` and gate/up into ``gate_up_proj``. Every parameter (every shard of a fused
        one) must be loaded exactly once: ValueError names an unexpected, repeated or missing weight.
        Weights of another pipeline stage's modules are skipped (``is_other_stage_weight``); the
        stage that holds them checks them, so across the stages every weight is still checked."""
        params = dict(self.named_parameters())  # a tied lm_head.weight appears once, as the embedding
        expected = {(name, shard_id) for name in params for shard_id in self._shard_ids(name)}
        loaded: set[tuple[str, str | int | None]] = set()
        for ckpt_name, tensor in weights:
            if self.is_other_stage_weight(ckpt_name):
                continue
            name, shard_id = self._param_name(ckpt_name)
            if (name, shard_id) not in expected:
                raise ValueError(f"The checkpoint has a weight this model does not expect: {ckpt_name!r}.")
            if (name, shard_id) in loaded:
                raise ValueError(f"The checkpoint has the weight {ckpt_name!r} twice.")
            param = params[name]
            weight_loader = getattr(param, "weight_loader", None)  # none on norms: copied whole
            try:
                if weight_loader is not None:
                    weight_loader(param, tensor, shard_id)
                else:
                    copy_checked(param.data, tensor)
            except ValueError as e:
                raise ValueError(f"Cannot load {ckpt_name!r}: {e}.") from e
            loaded.add((name, shard_id))
        missing = sorted(f"{name}[{shard}]" if shard is not None else name for name, shard in expected - loaded)
        if missing:
            raise ValueError(f"The checkpoint is missing weights: {missing[:5]}{' ...' if len(missing) > 5 else ''}.")

    def is_other_stage_weight(self, ckpt_name: str) -> bool:
        """True for a checkpoint tensor this model does not load: a rotary table, a tied checkpoint's
        ``lm_head.weight``, or (pipeline parallelism) a weight of a module another stage holds."""
        if "rotary_emb.inv_freq" in ckpt_name or (self.tie_word_embeddings and ckpt_name == "lm_head.weight"):
            return True
        if self.lm_head_from_embedding and ckpt_name == "model.embed_tokens.weight":
            return False
        return self._param_name(ckpt_name)[0].startswith(self.missing_prefixes)

    def _param_name(self, ckpt_name: str) -> tuple[str, str | int | None]:
        """``model.layers.0.self_attn.k_proj.weight`` -> (``model.layers.0.self_attn.qkv_proj.weight``, "k")."""
        if self.lm_head_from_embedding and ckpt_name == "model.embed_tokens.weight":
            return "lm_head.weight", None
        module_name, _, leaf = ckpt_name.rpartition(".")
        parent, _, proj = module_name.rpartition(".")
        if proj in self.stacked_params:
            fused, shard_id = self.stacked_params[proj]
            return f"{parent}.{fused}.{leaf}", shard_id
        return ckpt_name, None

    def _shard_ids(self, param_name: str) -> tuple:
        module = self.get_submodule(param_name.rpartition(".")[0])
        return getattr(module, "shard_ids", (None,))
