"""Our Llama / Mistral / Qwen2 / Qwen3 against transformers on tiny random checkpoints.

The test stands in for the scheduler and model runner: it gives each sequence scattered blocks of
one paged KV cache, builds the attention metadata by hand (block tables, slot mapping,
query_start_loc) and flattens several sequences into one forward, as the engine does. Every logit of
every scheduled token must equal transformers' for that sequence alone, in float32. The attention
backend is the one the engine picks: the cpu backend and its ops, or with
``TRACEVLLM_DISABLE_OPTIMIZATIONS=all`` the plain torch backend.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracevllm.attention.backends.abstract import AttentionMetadata
from tracevllm.attention.layer import Attention, bind_kv_cache
from tracevllm.attention.selector import get_attn_backend
from tracevllm.models.loader import load_model
from tracevllm.optimizations import OptimizationConfig

BLOCK_SIZE = 4
NUM_BLOCKS = 64
MAX_BLOCKS_PER_SEQ = 8  # 32 tokens per sequence at most
ATOL = RTOL = 1e-4

# name -> (tiny arch, config overrides)
VARIANTS = {
    "llama": ("llama", {}),
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}),
    "mistral-sliding": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen2-sliding": ("qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}),
    "qwen3": ("qwen3", {}),
}


class PagedSequences:
    """Sequences fed to ``model`` step by step. ``step(new_tokens)`` appends ``new_tokens[i]`` to
    sequence ``i`` (empty: not scheduled this step) and returns ``{i: logits of those tokens}``."""

    def __init__(self, model, attn_backend, num_seqs: int, dtype: torch.dtype) -> None:
        self.model = model
        layers = [m for m in model.modules() if isinstance(m, Attention)]
        self.metadata_builder = attn_backend.get_builder_cls()(layers[0].impl, dtype, BLOCK_SIZE,
                                                               OptimizationConfig.from_names())
        shape = lambda layer: (NUM_BLOCKS, BLOCK_SIZE, layer.num_kv_heads, layer.head_dim)  # noqa: E731
        # NaN in every unwritten slot: reading a slot a sequence does not own would poison its logits.
        self.kv_caches = [(torch.full(shape(layer), float("nan"), dtype=dtype),
                           torch.full(shape(layer), float("nan"), dtype=dtype)) for layer in layers]
        bind_kv_cache(model, self.kv_caches)
        blocks = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(0))
        self.block_table = blocks[: num_seqs * MAX_BLOCKS_PER_SEQ].view(num_seqs, -1).to(torch.int32)
        self.num_computed = [0] * num_seqs

    def step(self, new_tokens: list[list[int]]) -> dict[int, torch.Tensor]:
        rows = [i for i, tokens in enumerate(new_tokens) if tokens]
        input_ids, positions, slots = [], [], []
        for i in rows:
            pos = range(self.num_computed[i], self.num_computed[i] + len(new_tokens[i]))
            input_ids += new_tokens[i]
            positions += pos
            slots += [int(self.block_table[i, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in pos]
        query_lens = [len(new_tokens[i]) for i in rows]
        seq_lens = np.array([self.num_computed[i] + n for i, n in zip(rows, query_lens)], dtype=np.int32)
        query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
        md = self.metadata_builder.build(AttentionMetadata(
            num_actual_tokens=len(input_ids), max_query_len=max(query_lens), max_seq_len=int(seq_lens.max()),
            query_start_loc=torch.from_numpy(query_start_loc), seq_lens=torch.from_numpy(seq_lens),
            block_table=self.block_table[rows], slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc_cpu=query_start_loc, seq_lens_cpu=seq_lens,
        ))
        with torch.inference_mode():
            hidden_states = self.model(torch.tensor(input_ids), torch.tensor(positions), md)
            logits = self.model.compute_logits(hidden_states)
        assert logits.dtype == torch.float32
        for i, n in zip(rows, query_lens):
            self.num_computed[i] += n
        return {i: logits[query_start_loc[j] : query_start_loc[j + 1]] for j, i in enumerate(rows)}


def _load_both(tiny_checkpoint, variant: str, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    arch, overrides = VARIANTS[variant]
    path = tiny_checkpoint(arch, **overrides)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    backend = get_attn_backend(None, torch.device("cpu"))
    ours = load_model(path, dtype, torch.device("cpu"), backend)
    return hf, ours, backend


def _random_tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 49152, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("variant", VARIANTS)
def test_prefill_then_decode_matches_transformers(tiny_checkpoint, variant):
    """Three prompts of different lengths in one prefill forward, then four decode steps of the three
    together; transformers runs each sequence alone with its own KV cache."""
    hf, ours, backend = _load_both(tiny_checkpoint, variant)
    prompts = [_random_tokens(n, seed) for seed, n in enumerate((5, 11, 17))]
    seqs = PagedSequences(ours, backend, len(prompts), torch.float32)

    logits = seqs.step(prompts)
    hf_caches, next_tokens = [], []
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            out = hf(torch.tensor([prompt]), use_cache=True)
            torch.testing.assert_close(logits[i], out.logits[0], atol=ATOL, rtol=RTOL)
            hf_caches.append(out.past_key_values)
            next_tokens.append(int(out.logits[0, -1].argmax()))
        for _ in range(4):
            logits = seqs.step([[t] for t in next_tokens])
            for i in range(len(prompts)):
                out = hf(torch.tensor([[next_tokens[i]]]), past_key_values=hf_caches[i], use_cache=True)
                torch.testing.assert_close(logits[i], out.logits[0], atol=ATOL, rtol=RTOL)
                hf_caches[i] = out.past_key_values
                next_tokens[i] = int(out.logits[0, -1].argmax())


@pytest.mark.parametrize("variant", ["llama", "mistral-sliding", "qwen3"])
def test_chunked_prefill_in_a_mixed_batch(tiny_checkpoint, variant):
    """A prompt prefilled in two chunks (the second attends to the first through the cache) while
    another decodes and a third arrives: the schedules vLLM's token budget produces."""
    hf, ours, backend = _load_both(tiny_checkpoint, variant)
    full = [_random_tokens(n, 10 + seed) for seed, n in enumerate((16, 12, 9))]
    schedule = [  # tokens of each sequence per step: (start, end)
        [(0, 5), (0, 9), None],
        [(5, 13), (9, 10), (0, 7)],
        [(13, 16), (10, 11), (7, 9)],
        [None, (11, 12), None],
    ]
    seqs = PagedSequences(ours, backend, len(full), torch.float32)
    ours_logits: list[list[torch.Tensor]] = [[] for _ in full]
    for step in schedule:
        logits = seqs.step([full[i][s[0]:s[1]] if s else [] for i, s in enumerate(step)])
        for i, chunk in logits.items():
            ours_logits[i].append(chunk)
    with torch.inference_mode():
        for i, tokens in enumerate(full):
            expected = hf(torch.tensor([tokens])).logits[0]
            torch.testing.assert_close(torch.cat(ours_logits[i]), expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("variant", ["llama", "qwen2", "qwen3"])
def test_bfloat16_close_to_float32_transformers(tiny_checkpoint, variant):
    """bf16 weights and activations: the float32 logits up to bf16 rounding."""
    hf, ours, backend = _load_both(tiny_checkpoint, variant, torch.bfloat16)
    assert ours.model.embed_tokens.weight.dtype == torch.bfloat16
    prompts = [_random_tokens(n, 20 + seed) for seed, n in enumerate((7, 24))]
    logits = PagedSequences(ours, backend, len(prompts), torch.bfloat16).step(prompts)
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            expected = hf(torch.tensor([prompt])).logits[0]
            err = (logits[i] - expected).abs()
            # Logits here span about +-8 with std 1.6; bf16 keeps 8 bits of mantissa.
            assert err.mean() < 0.06 and err.max() < 0.6
            chosen = expected.gather(-1, logits[i].argmax(-1, keepdim=True))[:, 0]
            assert (expected.max(-1).values - chosen).max() < 0.25  # bf16's top token is a near-top one in fp32
