"""The torch paged-attention backend against a plain-torch reference on contiguous K/V
(the cases and the reference are in ``tests/attention_cases.py``)."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from tests.attention_cases import HEADS, MIXES, random_mix, run_case
from tracevllm.attention.backends.torch_attn import TorchAttentionBackend, TorchAttentionImpl
from tracevllm.attention.ops import cpu_amx_decode, cpu_amx_prefill, cpu_paged_decode
from tracevllm.attention.selector import get_attn_backend


@pytest.fixture(params=["gather_sdpa", "in_place", "in_place_amx"])
def decode_path(request, monkeypatch):
    """Decode rows through the plain gather + SDPA, through optimisation "cpu_paged_decode" (the C++
    op that reads K/V in place), and with "cpu_amx_decode" as well (its AMX twin, which takes the
    bf16 cases in blocks of 16 or 32; the others stay with the float32 op): the same cases, against
    the same reference."""
    if request.param != "gather_sdpa":
        assert cpu_paged_decode.load(), "the cpu_paged_decode op did not build (a C++ compiler and ninja are needed)"
        monkeypatch.setattr(TorchAttentionImpl, "decode_in_place", True)
    if request.param == "in_place_amx":
        if not cpu_amx_decode.supports(8, 2, 64, torch.bfloat16):
            pytest.skip("this CPU has no AMX tiles")
        assert cpu_amx_decode.load(), "the cpu_amx_decode op did not build"
        monkeypatch.setattr(TorchAttentionImpl, "decode_on_amx", True)
    return request.param


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.usefixtures("decode_path")
def test_matches_reference(mix, heads):
    seed = 100 * list(MIXES).index(mix) + list(HEADS).index(heads)
    run_case(seed, MIXES[mix], *HEADS[heads], head_dim=64, block_size=16, dtype=torch.float32)


@pytest.mark.parametrize("head_dim, block_size, dtype", [
    (128, 32, torch.float32), (64, 32, torch.float16), (128, 16, torch.bfloat16), (64, 16, torch.bfloat16),
], ids=lambda v: str(v).removeprefix("torch."))
@pytest.mark.parametrize("mix", ["decode_only", "mixed"])
@pytest.mark.usefixtures("decode_path")
def test_head_dims_block_sizes_dtypes(head_dim, block_size, dtype, mix):
    run_case(head_dim + block_size, MIXES[mix], *HEADS["gqa3"], head_dim, block_size, dtype)


@pytest.mark.parametrize("window", [1, 8, 40])
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.usefixtures("decode_path")
def test_sliding_window(mix, window):
    """Windows shorter and longer than the sequences, so both the window and the start bind."""
    run_case(window, MIXES[mix], *HEADS["gqa4"], 64, 16, torch.float32, window=window)


@pytest.mark.parametrize("share_plan", [False, True], ids=["per_layer_plan", "shared_plan"])
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.usefixtures("decode_path")
def test_random_batches(seed, share_plan, monkeypatch):
    """Also with optimisation "decode_plan", which keeps the step's rows and buckets in the metadata."""
    monkeypatch.setattr(TorchAttentionImpl, "share_plan", share_plan)
    rng = random.Random(seed)
    run_case(
        seed, random_mix(rng), *rng.choice(list(HEADS.values())), head_dim=rng.choice([64, 128]),
        block_size=rng.choice([16, 32]), dtype=rng.choice([torch.float32, torch.bfloat16]),
        window=rng.choice([None, rng.randint(1, 50)]),
    )


def test_outputs_survive_later_calls():
    """The gather workspace is shared by all layers; no output may alias it."""
    first = run_case(1, MIXES["mixed"], *HEADS["gqa3"], 64, 16, torch.float32)
    kept = first.clone()
    run_case(2, MIXES["decode_long_tail"], *HEADS["gqa3"], 64, 16, torch.float32)
    assert torch.equal(first, kept)


def test_inference_mode_then_grad_mode():
    """The engine runs under inference mode; a later call outside it (in the same thread, so with
    the same workspace) must still work."""
    errors = []

    def calls():
        try:
            with torch.inference_mode():  # the larger gather first, so the second reuses its buffer
                run_case(3, MIXES["decode_long_tail"], *HEADS["gqa4"], 64, 16, torch.float32)
            run_case(4, MIXES["decode_only"], *HEADS["gqa4"], 64, 16, torch.float32)
        except Exception as e:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(e)

    thread = threading.Thread(target=calls)  # a fresh thread starts with an empty workspace
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_selector(monkeypatch):
    cpu = torch.device("cpu")
    assert get_attn_backend(None, cpu) is TorchAttentionBackend
    assert get_attn_backend("auto", cpu) is TorchAttentionBackend
    assert get_attn_backend("torch", cpu) is TorchAttentionBackend
    assert TorchAttentionBackend.get_impl_cls() is TorchAttentionImpl
    with pytest.raises(ValueError, match="attention_backend must be one of .*'triton'.*got 'flash'"):
        get_attn_backend("flash", cpu)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        get_attn_backend("triton", cpu)


def test_in_place_decode_checks_its_indices():
    """The C++ op trusts the block table only after checking it: a bad entry is an error, not a
    read outside the cache."""
    assert cpu_paged_decode.load()
    cache = torch.zeros(2, 16, 1, 16)
    query = torch.zeros(1, 1, 16)
    block_table, seq_lens, index = torch.tensor([[5]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32), torch.tensor([0])
    with pytest.raises(RuntimeError, match="block id 5 out of range"):
        cpu_paged_decode.paged_decode_attention(torch.empty_like(query), query, cache, cache, block_table, seq_lens,
                                                index, index, 1.0, None)
    seq_lens[0] = 17  # one block of 16 holds 16 tokens
    with pytest.raises(RuntimeError, match="seq_len exceeds its block table"):
        cpu_paged_decode.paged_decode_attention(torch.empty_like(query), query, cache, cache, block_table, seq_lens,
                                                index, index, 1.0, None)


# Prefills that cross the op's 64-token blocks and 256-key steps, with and without a cached context,
# beside decode rows (which go to the decode path).
AMX_MIXES = {
    "long_prefills": [(300, 0), (64, 0), (65, 0), (1, 40), (2, 0)],
    "chunks_over_context": [(130, 70), (200, 57), (33, 300), (1, 120)],
    "short": MIXES["prefill_only"] + MIXES["chunked_over_context"],
}


@pytest.fixture(params=["amx", "vec"])
def amx_prefill(request, monkeypatch):
    """Prefill rows through the prefill op (bf16 only, so not in the cases above), its products on AMX
    tiles (optimisation "cpu_amx_prefill") or on AVX512-BF16 dot products ("cpu_vec_prefill"; a CPU
    with AMX has those too, so both run there)."""
    on_amx = request.param == "amx"
    if not cpu_amx_prefill.supports(64, torch.bfloat16, amx=on_amx):
        pytest.skip(f"this CPU has no {'AMX tiles' if on_amx else 'AVX512-BF16'}")
    assert cpu_amx_prefill.load(), "the cpu_amx_prefill op did not build (a C++ compiler and ninja are needed)"
    monkeypatch.setattr(TorchAttentionImpl, "prefill_in_place", True)
    monkeypatch.setattr(TorchAttentionImpl, "prefill_on_amx", on_amx)


@pytest.mark.parametrize("mix", list(AMX_MIXES))
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("head_dim, block_size", [(64, 16), (128, 32)])
@pytest.mark.usefixtures("amx_prefill", "decode_path")
def test_amx_prefill_matches_reference(mix, heads, head_dim, block_size):
    run_case(list(AMX_MIXES).index(mix), AMX_MIXES[mix], *HEADS[heads], head_dim, block_size, torch.bfloat16)


@pytest.mark.parametrize("window", [1, 8, 100])
@pytest.mark.parametrize("mix", list(AMX_MIXES))
@pytest.mark.usefixtures("amx_prefill")
def test_amx_prefill_sliding_window(mix, window):
    run_case(window, AMX_MIXES[mix], *HEADS["gqa4"], 64, 16, torch.bfloat16, window=window)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.usefixtures("amx_prefill")
def test_amx_prefill_random_batches(seed, monkeypatch):
    monkeypatch.setattr(TorchAttentionImpl, "share_plan", seed % 2 == 1)
    rng = random.Random(seed)
    mix = random_mix(rng) + [(rng.randint(60, 300), rng.choice([0, rng.randint(1, 300)]))]
    run_case(seed, mix, *rng.choice(list(HEADS.values())), head_dim=rng.choice([64, 128, 192, 256]),
             block_size=rng.choice([16, 32]), dtype=torch.bfloat16, window=rng.choice([None, rng.randint(1, 300)]))


@pytest.mark.skipif(not cpu_amx_prefill.supports(64, torch.bfloat16, amx=False), reason="this CPU has no AVX512-BF16")
def test_amx_prefill_checks_its_inputs():
    """A bad block id, a length past the block table, or a dtype the op does not take is an error."""
    assert cpu_amx_prefill.load()
    amx = cpu_amx_prefill.supports(64, torch.bfloat16)
    cache = torch.zeros(2, 16, 1, 64, dtype=torch.bfloat16)
    query = torch.zeros(3, 1, 64, dtype=torch.bfloat16)
    block_table, seq_lens = torch.tensor([[5]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    starts, rows = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0])

    def call(q=query, c=cache):
        cpu_amx_prefill.prefill_attention(torch.empty_like(q), q, c, c, block_table, starts, seq_lens, rows, 1.0, None,
                                          amx=amx)

    with pytest.raises(RuntimeError, match="block id 5 out of range"):
        call()
    block_table[0, 0], seq_lens[0] = 1, 17  # one block of 16 holds 16 tokens
    with pytest.raises(RuntimeError, match="has 3 query tokens and 17 keys"):
        call()
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        call(query.float(), cache.float())


# Decode rows whose keys end inside, at and past the AMX decode op's 16-key chunks and 64-key steps.
AMX_DECODE_MIX = [(1, c) for c in (0, 14, 15, 16, 31, 63, 64, 65, 130, 700)]
AMX_DECODE_HEADS = {**HEADS, "two_head_tiles": (32, 8), "group16": (16, 1), "qwen2": (14, 2)}


@pytest.fixture
def amx_decode(monkeypatch):
    """Decode rows through optimisation "cpu_amx_decode" (bf16 only)."""
    if not cpu_amx_decode.supports(8, 2, 64, torch.bfloat16):
        pytest.skip("this CPU has no AMX tiles")
    assert cpu_amx_decode.load(), "the cpu_amx_decode op did not build"
    monkeypatch.setattr(TorchAttentionImpl, "decode_in_place", True)
    monkeypatch.setattr(TorchAttentionImpl, "decode_on_amx", True)


@pytest.mark.parametrize("window", [None, 1, 8, 100])
@pytest.mark.parametrize("heads", list(AMX_DECODE_HEADS))
@pytest.mark.parametrize("head_dim, block_size", [(64, 16), (128, 32), (192, 16), (256, 64)])
@pytest.mark.usefixtures("amx_decode")
def test_amx_decode_matches_reference(head_dim, block_size, heads, window):
    """Heads in one tile or two (32 query heads), groups of 1 to 16, windows that start mid-chunk."""
    run_case(head_dim + block_size, AMX_DECODE_MIX, *AMX_DECODE_HEADS[heads], head_dim, block_size, torch.bfloat16,
             window=window)


@pytest.mark.usefixtures("amx_decode")
def test_amx_decode_checks_its_inputs():
    """A bad block id, a length past the block table, or a layout the op does not take is an error."""
    cache = torch.zeros(2, 16, 1, 64, dtype=torch.bfloat16)
    query = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    block_table, seq_lens, index = torch.tensor([[5]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32), torch.tensor([0])

    def call(q=query, c=cache):
        cpu_amx_decode.amx_decode_attention(torch.empty_like(q), q, c, c, block_table, seq_lens, index, index, 1.0, None)

    with pytest.raises(RuntimeError, match="block id 5 out of range"):
        call()
    block_table[0, 0], seq_lens[0] = 1, 17  # one block of 16 holds 16 tokens
    with pytest.raises(RuntimeError, match="seq_len exceeds its block table"):
        call()
    seq_lens[0] = 3
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        call(query.float(), cache.float())
    with pytest.raises(RuntimeError, match="block_size a multiple of 16"):
        call(c=torch.zeros(4, 8, 1, 64, dtype=torch.bfloat16))
