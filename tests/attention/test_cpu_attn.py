"""The cpu attention backend: the torch backend's cases (``tests/attention_cases.py``) through each op
it can choose, against the same plain-torch reference; its choice of ops; its step plan."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.attention_cases import HEADS, MIXES, random_mix, run_case
from tracevllm.attention.backends import cpu_attn
from tracevllm.attention.backends.abstract import AttentionMetadata
from tracevllm.attention.backends.cpu_attn import (
    CPUAttentionBackend, CPUAttentionImpl, CPUAttentionMetadataBuilder, CPUAttentionOps, choose_cpu_attention_ops,
)
from tracevllm.attention.ops import cpu_amx_decode, cpu_amx_prefill, cpu_paged_decode, cpu_vec_decode
from tracevllm.optimizations import OptimizationConfig


@pytest.fixture
def disabled():
    """The optimisations a test's cases run with off: by default the prefill ops (bf16 only, so not in
    most cases; the ``amx_prefill`` fixture turns them back on)."""
    return {"cpu_amx_prefill", "cpu_vec_prefill"}


def run_cpu_case(disabled, *args, **kwargs):
    return run_case(*args, backend=CPUAttentionBackend, disabled=disabled, **kwargs)


@pytest.fixture(params=["gather_sdpa", "in_place", "in_place_amx", "in_place_vec"])
def decode_path(request, disabled):
    """Decode rows through the torch backend's gather + SDPA, through optimisation "cpu_paged_decode"
    (the C++ op that reads K/V in place), and with "cpu_amx_decode" or "cpu_vec_decode" as well (its
    twins on AMX tiles and on AVX512-BF16 dot products, which the backend chooses for the bf16 cases
    (the AMX one in blocks of 16 or 32); the others get the float32 op): the same cases, against the
    same reference."""
    if request.param != "gather_sdpa":
        assert cpu_paged_decode.load(), "the cpu_paged_decode op did not build (a C++ compiler and ninja are needed)"
    if request.param == "in_place_amx":
        if not cpu_amx_decode.supports(8, 2, 64, torch.bfloat16):
            pytest.skip("this CPU has no AMX tiles")
        assert cpu_amx_decode.load(), "the cpu_amx_decode op did not build"
    if request.param == "in_place_vec":
        if not cpu_vec_decode.supports(8, 2, 64, torch.bfloat16):
            pytest.skip("this CPU has no AVX512-BF16")
        assert cpu_vec_decode.load(), "the cpu_vec_decode op did not build"
    disabled |= {"gather_sdpa": {"cpu_paged_decode", "cpu_amx_decode", "cpu_vec_decode"},
                 "in_place": {"cpu_amx_decode", "cpu_vec_decode"}, "in_place_amx": {"cpu_vec_decode"},
                 "in_place_vec": {"cpu_amx_decode"}}[request.param]
    return request.param


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.usefixtures("decode_path")
def test_matches_reference(disabled, mix, heads):
    seed = 100 * list(MIXES).index(mix) + list(HEADS).index(heads)
    run_cpu_case(disabled, seed, MIXES[mix], *HEADS[heads], head_dim=64, block_size=16, dtype=torch.float32)


@pytest.mark.parametrize("head_dim, block_size, dtype", [
    (128, 32, torch.float32), (64, 32, torch.float16), (128, 16, torch.bfloat16), (64, 16, torch.bfloat16),
], ids=lambda v: str(v).removeprefix("torch."))
@pytest.mark.parametrize("mix", ["decode_only", "mixed"])
@pytest.mark.usefixtures("decode_path")
def test_head_dims_block_sizes_dtypes(disabled, head_dim, block_size, dtype, mix):
    run_cpu_case(disabled, head_dim + block_size, MIXES[mix], *HEADS["gqa3"], head_dim, block_size, dtype)


@pytest.mark.parametrize("window", [1, 8, 40])
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.usefixtures("decode_path")
def test_sliding_window(disabled, mix, window):
    run_cpu_case(disabled, window, MIXES[mix], *HEADS["gqa4"], 64, 16, torch.float32, window=window)


@pytest.mark.parametrize("decode_plan", [False, True], ids=["per_layer_plan", "shared_plan"])
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.usefixtures("decode_path")
def test_random_batches(disabled, seed, decode_plan):
    """With optimisation "decode_plan" and without: one plan for the step, or one per layer."""
    rng = random.Random(seed)
    run_cpu_case(
        disabled | ({"decode_plan"} if not decode_plan else set()),
        seed, random_mix(rng), *rng.choice(list(HEADS.values())), head_dim=rng.choice([64, 128]),
        block_size=rng.choice([16, 32]), dtype=rng.choice([torch.float32, torch.bfloat16]),
        window=rng.choice([None, rng.randint(1, 50)]),
    )


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


# ---- the choice ----------------------------------------------------------------------------------

class _Heads:  # what choose_cpu_attention_ops reads of a layer
    def __init__(self, num_heads=8, num_kv_heads=2, head_dim=64):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim


@pytest.fixture
def cpu_with(monkeypatch):
    """Pretend this CPU has AMX tiles and/or AVX512-BF16 (as torch reports them to the ops' ``supports``)
    and that every op builds: the choice is then the same on any machine."""
    def pretend(tiles: bool, avx512_bf16: bool):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: tiles)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16 or tiles)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability",
                            lambda: "AVX512" if tiles or avx512_bf16 else "AVX2")
        monkeypatch.setattr(cpu_attn, "_LOADERS", dict.fromkeys(cpu_attn._LOADERS, lambda: True))
    return pretend


def _choose(disabled=(), dtype=torch.bfloat16, block_size=16, **heads):
    return choose_cpu_attention_ops(_Heads(**heads), dtype, block_size, OptimizationConfig(frozenset(disabled)))


def test_choice_with_amx(cpu_with):
    cpu_with(tiles=True, avx512_bf16=True)
    assert _choose() == CPUAttentionOps("cpu_amx_decode", "cpu_amx_prefill")
    assert _choose(["cpu_amx_decode"]) == CPUAttentionOps("cpu_vec_decode", "cpu_amx_prefill")
    assert _choose(["cpu_amx_decode", "cpu_vec_decode"]) == CPUAttentionOps("cpu_paged_decode", "cpu_amx_prefill")
    assert _choose(["cpu_paged_decode"]) == CPUAttentionOps("sdpa", "cpu_amx_prefill")  # amx decode needs it
    assert _choose(["cpu_amx_prefill"]) == CPUAttentionOps("cpu_amx_decode", "sdpa")  # tiles or SDPA, never vec
    assert _choose(block_size=8) == CPUAttentionOps("cpu_vec_decode", "cpu_amx_prefill")  # any block size
    assert _choose(dtype=torch.float32) == CPUAttentionOps("cpu_paged_decode", "sdpa")
    assert _choose(num_heads=34, num_kv_heads=2) == CPUAttentionOps("cpu_paged_decode", "cpu_amx_prefill")
    assert _choose(head_dim=32) == CPUAttentionOps("cpu_paged_decode", "sdpa")
    assert _choose(head_dim=192) == CPUAttentionOps("cpu_amx_decode", "cpu_amx_prefill")
    assert _choose(head_dim=80, dtype=torch.float32) == CPUAttentionOps("sdpa", "sdpa")


def test_choice_with_avx512_bf16_only(cpu_with):
    cpu_with(tiles=False, avx512_bf16=True)
    assert _choose() == CPUAttentionOps("cpu_vec_decode", "cpu_vec_prefill")
    assert _choose(block_size=8) == CPUAttentionOps("cpu_vec_decode", "cpu_vec_prefill")  # any block size
    assert _choose(["cpu_vec_decode"]) == CPUAttentionOps("cpu_paged_decode", "cpu_vec_prefill")
    assert _choose(["cpu_paged_decode"]) == CPUAttentionOps("sdpa", "cpu_vec_prefill")  # vec decode needs it
    assert _choose(dtype=torch.float32) == CPUAttentionOps("cpu_paged_decode", "sdpa")
    assert _choose(num_heads=34, num_kv_heads=2) == CPUAttentionOps("cpu_paged_decode", "cpu_vec_prefill")
    assert _choose(["cpu_vec_prefill"]) == CPUAttentionOps("cpu_vec_decode", "sdpa")
    assert _choose(["cpu_amx_prefill"]) == CPUAttentionOps("cpu_vec_decode", "cpu_vec_prefill")


def test_choice_with_neither(cpu_with):
    cpu_with(tiles=False, avx512_bf16=False)
    assert _choose() == CPUAttentionOps("cpu_paged_decode", "sdpa")
    assert _choose(["cpu_paged_decode"]) == CPUAttentionOps("sdpa", "sdpa")


def test_choice_falls_back_when_an_op_does_not_build(cpu_with, monkeypatch):
    cpu_with(tiles=True, avx512_bf16=True)
    monkeypatch.setitem(cpu_attn._LOADERS, "cpu_amx_decode", lambda: False)
    monkeypatch.setitem(cpu_attn._LOADERS, "cpu_amx_prefill", lambda: False)
    assert _choose() == CPUAttentionOps("cpu_vec_decode", "sdpa")
    monkeypatch.setitem(cpu_attn._LOADERS, "cpu_vec_decode", lambda: False)
    assert _choose() == CPUAttentionOps("cpu_paged_decode", "sdpa")


def test_choice_on_this_cpu():
    """Here, for real: the AMX op where there are tiles, else the AVX512-BF16 op where that is, else the
    float32 vector op where the C++ op builds; the prefill op where AVX512-BF16 is."""
    ops = _choose(dtype=torch.bfloat16)
    assert ops.decode == ("cpu_amx_decode" if cpu_amx_decode.supports(8, 2, 64, torch.bfloat16) else
                          "cpu_vec_decode" if cpu_vec_decode.supports(8, 2, 64, torch.bfloat16) else "cpu_paged_decode")
    if cpu_amx_prefill.supports(64, torch.bfloat16):
        assert ops.prefill == "cpu_amx_prefill"
    else:
        assert ops.prefill == ("cpu_vec_prefill" if cpu_amx_prefill.supports(64, torch.bfloat16, amx=False) else "sdpa")


# ---- the step plan -------------------------------------------------------------------------------

def _metadata(seq_lens, query_lens):
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    seq_lens = np.array(seq_lens, dtype=np.int32)
    num_tokens = int(query_start_loc[-1])
    return AttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=max(query_lens), max_seq_len=int(seq_lens.max()),
        query_start_loc=torch.from_numpy(query_start_loc), seq_lens=torch.from_numpy(seq_lens),
        block_table=torch.arange(8, dtype=torch.int32).view(len(seq_lens), -1),
        slot_mapping=torch.arange(num_tokens), query_start_loc_cpu=query_start_loc, seq_lens_cpu=seq_lens)


@pytest.mark.parametrize("decode_plan", [True, False])
def test_one_plan_per_step(decode_plan):
    """With "decode_plan" the builder gives each step one plan, which every layer of the same window
    reads (the first one fills it); without it, the metadata carries none and each layer plans alone."""
    impls = [CPUAttentionImpl(4, 16, 2, 0.25, window) for window in (None, None, 3)]
    config = OptimizationConfig(frozenset() if decode_plan else {"decode_plan"})
    builder = CPUAttentionMetadataBuilder(impls[0], torch.float32, 4, config)
    md = builder.build(_metadata([5, 9], [1, 4]))
    assert md.ops == builder.ops and (md.plan is not None) == decode_plan
    if decode_plan:
        assert list(md.plan.rows.decode) == [0] and md.plan.rows.prefill == [1]
        first, same, windowed = (md.plan.decode_buckets(impl, md, 4) for impl in impls)
        assert first is same and windowed is not first and windowed[0].span == 3
        assert md.plan.decode_index(md) is md.plan.decode_index(md)
        assert builder.build(_metadata([5, 9], [1, 4])).plan is not md.plan  # a new step, a new plan


# ---- the prefill op ------------------------------------------------------------------------------

# Prefills that cross the op's 64-token blocks and 256-key steps, with and without a cached context,
# beside decode rows (which go to the decode path).
AMX_MIXES = {
    "long_prefills": [(300, 0), (64, 0), (65, 0), (1, 40), (2, 0)],
    "chunks_over_context": [(130, 70), (200, 57), (33, 300), (1, 120)],
    "short": MIXES["prefill_only"] + MIXES["chunked_over_context"],
}


@pytest.fixture(params=["amx", "vec"])
def amx_prefill(request, disabled, monkeypatch):
    """Prefill rows through the prefill op (bf16 only, so not in the cases above), its products on AMX
    tiles (optimisation "cpu_amx_prefill") or on AVX512-BF16 dot products ("cpu_vec_prefill"; a CPU
    with AMX has those too, so both run there: "vec" pretends the CPU has no tiles, as on a Zen 4)."""
    on_amx = request.param == "amx"
    if not cpu_amx_prefill.supports(64, torch.bfloat16, amx=on_amx):
        pytest.skip(f"this CPU has no {'AMX tiles' if on_amx else 'AVX512-BF16'}")
    assert cpu_amx_prefill.load(), "the cpu_amx_prefill op did not build (a C++ compiler and ninja are needed)"
    if not on_amx:
        supports = cpu_amx_prefill.supports
        monkeypatch.setattr(cpu_amx_prefill, "supports", lambda head_dim, dtype, amx=True: (
            not amx and supports(head_dim, dtype, amx=False)))
    disabled -= {"cpu_amx_prefill", "cpu_vec_prefill"}
    ops = choose_cpu_attention_ops(_Heads(), torch.bfloat16, 16, OptimizationConfig(frozenset(disabled)))
    assert ops.prefill == ("cpu_amx_prefill" if on_amx else "cpu_vec_prefill")


@pytest.mark.parametrize("mix", list(AMX_MIXES))
@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("head_dim, block_size", [(64, 16), (128, 32)])
@pytest.mark.usefixtures("amx_prefill", "decode_path")
def test_amx_prefill_matches_reference(disabled, mix, heads, head_dim, block_size):
    run_cpu_case(disabled, list(AMX_MIXES).index(mix), AMX_MIXES[mix], *HEADS[heads], head_dim, block_size,
                 torch.bfloat16)


@pytest.mark.parametrize("window", [1, 8, 100])
@pytest.mark.parametrize("mix", list(AMX_MIXES))
@pytest.mark.usefixtures("amx_prefill")
def test_amx_prefill_sliding_window(disabled, mix, window):
    run_cpu_case(disabled, window, AMX_MIXES[mix], *HEADS["gqa4"], 64, 16, torch.bfloat16, window=window)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.usefixtures("amx_prefill")
def test_amx_prefill_random_batches(disabled, seed):
    rng = random.Random(seed)
    mix = random_mix(rng) + [(rng.randint(60, 300), rng.choice([0, rng.randint(1, 300)]))]
    run_cpu_case(disabled | ({"decode_plan"} if seed % 2 == 0 else set()), seed, mix,
                 *rng.choice(list(HEADS.values())), head_dim=rng.choice([64, 128, 192, 256]),
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


# ---- the AMX decode op ---------------------------------------------------------------------------

# Decode rows whose keys end inside, at and past the AMX decode op's 16-key chunks and 64-key steps
# (the AVX512-BF16 op's 16-key batches too).
AMX_DECODE_MIX = [(1, c) for c in (0, 14, 15, 16, 31, 63, 64, 65, 130, 700)]
AMX_DECODE_HEADS = {**HEADS, "two_head_tiles": (32, 8), "group16": (16, 1), "qwen2": (14, 2)}
BF16_DECODE_OPS = {"cpu_amx_decode": cpu_amx_decode, "cpu_vec_decode": cpu_vec_decode}


@pytest.fixture(params=list(BF16_DECODE_OPS))
def bf16_decode(request, disabled):
    """Decode rows through optimisation "cpu_amx_decode" or "cpu_vec_decode" (bf16 only), the other off."""
    op = BF16_DECODE_OPS[request.param]
    if not op.supports(8, 2, 64, torch.bfloat16):
        pytest.skip(f"this CPU has no {'AMX tiles' if request.param == 'cpu_amx_decode' else 'AVX512-BF16'}")
    assert op.load(), f"the {request.param} op did not build"
    disabled |= set(BF16_DECODE_OPS) - {request.param}
    return request.param


@pytest.mark.parametrize("window", [None, 1, 8, 100])
@pytest.mark.parametrize("heads", list(AMX_DECODE_HEADS))
@pytest.mark.parametrize("head_dim, block_size", [(64, 16), (128, 32), (192, 16), (256, 64)])
def test_bf16_decode_matches_reference(bf16_decode, disabled, head_dim, block_size, heads, window):
    """Heads in one AMX tile or two (32 query heads), groups of 1 to 16, windows that start mid-chunk."""
    num_heads, num_kv_heads = AMX_DECODE_HEADS[heads]
    config = OptimizationConfig(frozenset(disabled))
    heads_of = _Heads(num_heads, num_kv_heads, head_dim)
    assert choose_cpu_attention_ops(heads_of, torch.bfloat16, block_size, config).decode == bf16_decode
    run_cpu_case(disabled, head_dim + block_size, AMX_DECODE_MIX, num_heads, num_kv_heads, head_dim, block_size,
                 torch.bfloat16, window=window)


@pytest.mark.parametrize("block_size", [1, 8])
def test_vec_decode_takes_any_block_size(disabled, block_size):
    """The AVX512-BF16 op finds each key's row on its own: blocks smaller than its 16-key batches."""
    if not cpu_vec_decode.supports(9, 3, 64, torch.bfloat16):
        pytest.skip("this CPU has no AVX512-BF16")
    disabled |= {"cpu_amx_decode"}
    config = OptimizationConfig(frozenset(disabled))
    assert choose_cpu_attention_ops(_Heads(9, 3, 64), torch.bfloat16, block_size, config).decode == "cpu_vec_decode"
    run_cpu_case(disabled, block_size, AMX_DECODE_MIX, 9, 3, 64, block_size, torch.bfloat16, window=None)


def test_bf16_decode_checks_its_inputs(bf16_decode):
    """A bad block id, a length past the block table, or a layout the op does not take is an error."""
    op = getattr(BF16_DECODE_OPS[bf16_decode], bf16_decode.removeprefix("cpu_") + "_attention")
    cache = torch.zeros(2, 16, 1, 64, dtype=torch.bfloat16)
    query = torch.zeros(1, 1, 64, dtype=torch.bfloat16)
    block_table, seq_lens, index = torch.tensor([[5]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32), torch.tensor([0])

    def call(q=query, c=cache):
        op(torch.empty_like(q), q, c, c, block_table, seq_lens, index, index, 1.0, None)

    with pytest.raises(RuntimeError, match="block id 5 out of range"):
        call()
    block_table[0, 0], seq_lens[0] = 1, 17  # one block of 16 holds 16 tokens
    with pytest.raises(RuntimeError, match="seq_len exceeds its block table"):
        call()
    seq_lens[0] = 3
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        call(query.float(), cache.float())
    with pytest.raises(RuntimeError, match="head_dim 64, 128, 192 or 256"):
        call(torch.zeros(1, 1, 32, dtype=torch.bfloat16), torch.zeros(2, 16, 1, 32, dtype=torch.bfloat16))
    if bf16_decode == "cpu_amx_decode":
        with pytest.raises(RuntimeError, match="block_size a multiple of 16"):
            call(c=torch.zeros(4, 8, 1, 64, dtype=torch.bfloat16))


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_start(tmp_path):
    """torch waits for a build's lock file to go; one left by a build that was killed is older than
    ``STALE_LOCK_S``, and the next process removes it and loads the op instead of waiting forever."""
    import os
    import subprocess
    import sys
    import time

    from tracevllm.attention.ops.cpu_extension import STALE_LOCK_S

    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    load = "from tracevllm.attention.ops import cpu_paged_decode; print(cpu_paged_decode.load())"
    build = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=300)
    assert build.stdout.strip() == "True", build.stderr
    (build_dir,) = [d for d in tmp_path.rglob("tracevllm_cpu_paged_decode_*") if d.is_dir()]
    lock = build_dir / "lock"
    lock.touch()
    os.utime(lock, (time.time() - 2 * STALE_LOCK_S,) * 2)
    again = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=120)
    assert again.stdout.strip() == "True" and not lock.exists(), again.stderr
    assert "a build of this C++ op was stopped before it finished" in again.stderr


def test_each_checkout_and_each_version_of_an_op_has_its_own_build(tmp_path):
    """An op's build directory is named by its source (content, headers, path), flags and torch: two
    checkouts on one machine keep their own builds instead of rebuilding over each other at each start."""
    from pathlib import Path

    from tracevllm.attention.ops.cpu_extension import extension_name

    here = Path(__file__).parents[2] / "tracevllm" / "attention" / "ops" / "cpu_paged_decode.cpp"
    copy = tmp_path / "cpu_paged_decode.cpp"
    copy.write_bytes(here.read_bytes())
    name = extension_name("cpu_paged_decode", "AVX2", here, ["-O3"])
    assert name.startswith("tracevllm_cpu_paged_decode_avx2_")
    assert extension_name("cpu_paged_decode", "AVX2", here, ["-O3"]) == name
    assert extension_name("cpu_paged_decode", "AVX2", copy, ["-O3"]) != name  # another checkout
    assert extension_name("cpu_paged_decode", "AVX2", here, ["-O2"]) != name
    before = extension_name("cpu_paged_decode", "AVX2", copy, ["-O3"])
    copy.write_text(copy.read_text() + "\n// changed\n")
    assert extension_name("cpu_paged_decode", "AVX2", copy, ["-O3"]) != before
