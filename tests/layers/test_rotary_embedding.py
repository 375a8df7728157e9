"""RoPE (default and llama3 scaling) against transformers' own rotary embedding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tracevllm.layers.rotary_embedding import get_rope, get_rope_parameters

HEAD_DIM, NUM_HEADS, NUM_KV_HEADS, MAX_POSITION = 64, 4, 2, 4096
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 256}


def _hf_rotate(rope_parameters: dict, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=HEAD_DIM * NUM_HEADS, num_attention_heads=NUM_HEADS,
                         num_key_value_heads=NUM_KV_HEADS, max_position_embeddings=MAX_POSITION,
                         rope_parameters=rope_parameters)
    t = q.shape[0]
    q = q.view(1, t, NUM_HEADS, HEAD_DIM).transpose(1, 2)  # HF: [batch, heads, tokens, D]
    k = k.view(1, t, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q.transpose(1, 2).reshape(t, -1), k.transpose(1, 2).reshape(t, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rope_parameters", [{"rope_type": "default", "rope_theta": 10000.0}, LLAMA3],
                         ids=["default", "llama3"])
def test_matches_transformers(rope_parameters, dtype):
    g = torch.Generator().manual_seed(0)
    # Unordered positions spanning the llama3 wavelength bands, as a mixed batch has them.
    positions = torch.cat([torch.arange(5), torch.randint(0, MAX_POSITION, (27,), generator=g)])
    q = torch.randn(len(positions), NUM_HEADS * HEAD_DIM, generator=g).to(dtype)
    k = torch.randn(len(positions), NUM_KV_HEADS * HEAD_DIM, generator=g).to(dtype)
    rope = get_rope(HEAD_DIM, MAX_POSITION, rope_parameters)
    ours_q, ours_k = rope(positions, q, k)
    hf_q, hf_k = _hf_rotate(rope_parameters, positions, q, k)
    assert ours_q.dtype == dtype
    torch.testing.assert_close(ours_q, hf_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours_k, hf_k, atol=1e-6, rtol=1e-6)


def test_llama3_differs_from_default():
    """The scaling must change the slow frequencies (else the test above could not tell the two apart)."""
    positions = torch.tensor([200])
    q, k = torch.ones(1, HEAD_DIM), torch.ones(1, HEAD_DIM)
    default = get_rope(HEAD_DIM, MAX_POSITION, {**LLAMA3, "rope_type": "default"})(positions, q, k)[0]
    assert not torch.allclose(get_rope(HEAD_DIM, MAX_POSITION, LLAMA3)(positions, q, k)[0], default)


def test_rope_parameters_from_old_and_new_configs():
    new = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert get_rope_parameters(new) == {"rope_type": "default", "rope_theta": 1e6}
    old = SimpleNamespace(rope_theta=5e5, rope_scaling={"type": "llama3", "factor": 8.0})
    assert get_rope_parameters(old) == {"type": "llama3", "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    assert get_rope_parameters(SimpleNamespace(rope_theta=1e4, rope_scaling=None)) == {
        "rope_type": "default", "rope_theta": 1e4}


def test_unsupported_rope_is_a_value_error():
    with pytest.raises(ValueError, match="rope_type.*'yarn'"):
        get_rope(HEAD_DIM, 16, {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        get_rope(HEAD_DIM, 16, {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0})
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        get_rope(HEAD_DIM, 16, {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})
