"""The Triton backend (``reshape_and_cache`` + ``unified_attention``) against the plain-torch
reference, on the same NaN-poisoned paged caches as the torch backend (``tests/attention_cases.py``).

On a CPU the kernels run under Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1``),
with small shapes so that the interpreter stays fast; on a CUDA machine the same tests run compiled.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from tests.attention_cases import HEADS, MIXES, random_mix, run_case  # noqa: E402
from tracevllm.attention.backends.triton_attn import TritonAttentionBackend  # noqa: E402
from tracevllm.attention.ops import triton_unified_attention as ua  # noqa: E402
from tracevllm.attention.selector import get_attn_backend  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = [torch.float16, torch.bfloat16]  # under the interpreter, bf16 is upcast before tl.dot


@pytest.fixture(params=["split_kv_off", "split_kv_on"])
def split_kv(request, monkeypatch):
    """Force the split-KV path on or off (it is only ever taken for decode-only batches)."""
    on = request.param == "split_kv_on"
    monkeypatch.setattr(ua, "use_split_kv", lambda num_seqs, num_kv_heads, max_query_len, max_seq_len:
                        on and max_query_len == 1)
    return on


def triton_case(*args, **kwargs):
    return run_case(*args, backend=TritonAttentionBackend, device=DEVICE, **kwargs)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("heads", list(HEADS))
def test_matches_reference(mix, heads, split_kv):
    seed = 1000 + 100 * list(MIXES).index(mix) + list(HEADS).index(heads)
    triton_case(seed, MIXES[mix], *HEADS[heads], head_dim=64, block_size=16, dtype=torch.float32)


@pytest.mark.parametrize("head_dim, block_size", [(128, 32), (64, 32), (128, 16)])
@pytest.mark.parametrize("dtype", HALF + [torch.float32], ids=str)
@pytest.mark.parametrize("mix", ["decode_long_tail", "mixed"])
def test_head_dims_block_sizes_dtypes(head_dim, block_size, dtype, mix, split_kv):
    triton_case(head_dim + block_size, MIXES[mix], *HEADS["gqa3"], head_dim, block_size, dtype)


@pytest.mark.parametrize("window", [1, 8, 40])
@pytest.mark.parametrize("mix", ["decode_long_tail", "chunked_over_context", "mixed"])
def test_sliding_window(mix, window, split_kv):
    triton_case(window, MIXES[mix], *HEADS["gqa4"], 64, 16, torch.float32, window=window)


@pytest.mark.parametrize("seed", range(8))
def test_random_batches(seed):
    rng = random.Random(1000 + seed)
    mix = random_mix(rng)
    dtype = rng.choice([torch.float32, *HALF])
    triton_case(
        seed, mix, *rng.choice(list(HEADS.values())), head_dim=rng.choice([64, 128]),
        block_size=rng.choice([16, 32]), dtype=dtype, window=rng.choice([None, rng.randint(1, 50)]),
    )


def test_decode_batch_takes_split_kv_by_default():
    assert ua.use_split_kv(num_seqs=4, num_kv_heads=8, max_query_len=1, max_seq_len=4096)
    assert not ua.use_split_kv(num_seqs=4, num_kv_heads=8, max_query_len=2, max_seq_len=4096)  # prefill in it
    assert not ua.use_split_kv(num_seqs=64, num_kv_heads=8, max_query_len=1, max_seq_len=4096)  # GPU is full
    assert not ua.use_split_kv(num_seqs=4, num_kv_heads=8, max_query_len=1, max_seq_len=100)  # short


def test_selected_by_name():
    assert get_attn_backend("triton", torch.device(DEVICE)) is TritonAttentionBackend


def test_bench_kernels_runs_and_checks_agreement(capsys):
    """``tracevllm bench kernels`` on tiny shapes: it checks the kernel against its SDPA baseline
    before timing (split-KV included: a 2-sequence decode over 1,100 tokens), and prints both."""
    from tracevllm.entrypoints.cli import main

    assert main(["bench", "kernels", "--shapes", "9:3:64", "--batch-sizes", "2", "--context-lens", "1100",
                 "--prefill-lens", "40", "--iters", "1", "--dtype", "float32", "--device", DEVICE]) == 0
    out = capsys.readouterr().out
    assert "9:3:64 B=2 L=1100" in out and "9:3:64 L=40" in out
