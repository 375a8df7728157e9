"""The torch paged-attention backend, the plain reference path, against a plain-torch reference on
contiguous K/V (the cases and the reference are in ``tests/attention_cases.py``). The cpu backend
runs the same cases through its ops in ``test_cpu_attn.py``."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from tests.attention_cases import HEADS, MIXES, random_mix, run_case


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("heads", list(HEADS))
def test_matches_reference(mix, heads):
    seed = 100 * list(MIXES).index(mix) + list(HEADS).index(heads)
    run_case(seed, MIXES[mix], *HEADS[heads], head_dim=64, block_size=16, dtype=torch.float32)


@pytest.mark.parametrize("head_dim, block_size, dtype", [
    (128, 32, torch.float32), (64, 32, torch.float16), (128, 16, torch.bfloat16), (64, 16, torch.bfloat16),
], ids=lambda v: str(v).removeprefix("torch."))
@pytest.mark.parametrize("mix", ["decode_only", "mixed"])
def test_head_dims_block_sizes_dtypes(head_dim, block_size, dtype, mix):
    run_case(head_dim + block_size, MIXES[mix], *HEADS["gqa3"], head_dim, block_size, dtype)


@pytest.mark.parametrize("window", [1, 8, 40])
@pytest.mark.parametrize("mix", list(MIXES))
def test_sliding_window(mix, window):
    """Windows shorter and longer than the sequences, so both the window and the start bind."""
    run_case(window, MIXES[mix], *HEADS["gqa4"], 64, 16, torch.float32, window=window)


@pytest.mark.parametrize("seed", range(12))
def test_random_batches(seed):
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
