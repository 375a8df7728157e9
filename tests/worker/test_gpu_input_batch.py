"""The persistent batch: rows stay dense and every array moves with its request."""

from __future__ import annotations

import numpy as np
import torch

from tracevllm.sampling_params import SamplingParams
from tracevllm.worker.gpu_input_batch import CachedRequestState, InputBatch


def state(i: int, n_prompt: int, **params) -> CachedRequestState:
    return CachedRequestState(f"r{i}", list(range(100 * i, 100 * i + n_prompt)), SamplingParams(**params),
                              None, block_ids=[i * 10 + j for j in range(-(-n_prompt // 4))], num_computed_tokens=0)


def test_remove_and_condense_moves_rows():
    batch = InputBatch(max_num_reqs=8, max_model_len=32, block_size=4, vocab_size=1000, device=torch.device("cpu"))
    for i in range(5):
        batch.add_request(state(i, 3 + i, temperature=0.1 * i, top_k=i + 1))
    batch.remove_request("r1")
    batch.remove_request("r4")
    batch.condense()
    assert batch.req_ids == ["r0", "r3", "r2"] and batch.num_reqs == 3
    row = batch.req_id_to_index["r3"]
    assert row == 1
    assert batch.token_ids_cpu[row, : batch.num_tokens[row]].tolist() == list(range(300, 306))
    assert batch.block_table.block_table_np[row, :2].tolist() == [30, 31]
    assert np.isclose(batch.temperature[row], 0.3) and batch.top_k[row] == 4
    batch.append_token(row, 7)
    assert batch.requests["r3"].output_token_ids == [7] and batch.num_tokens[row] == 7
    batch.add_request(state(9, 2))
    assert batch.req_id_to_index["r9"] == 3


def test_sampling_metadata_skips_unused_stages():
    batch = InputBatch(max_num_reqs=4, max_model_len=16, block_size=4, vocab_size=50, device=torch.device("cpu"))
    batch.add_request(state(0, 3, temperature=0.0))
    batch.add_request(state(1, 3, temperature=0.5, top_p=0.9, repetition_penalty=1.2, logprobs=2))
    md = batch.make_sampling_metadata(np.array([0]))
    assert md.all_greedy and md.temperature is None and md.no_penalties and md.max_num_logprobs is None
    md = batch.make_sampling_metadata(np.array([1, 0]))
    assert not md.all_greedy and not md.all_random and md.top_k is None
    assert md.top_p.tolist() == [np.float32(0.9), 1.0] and md.max_num_logprobs == 2
    assert md.prompt_token_ids.shape == (2, 3)


def test_top_k_at_or_above_the_vocabulary_means_all_tokens():
    """A top_k as large as int64 allows fits the int64 row (no OverflowError) and switches top-k off."""
    batch = InputBatch(max_num_reqs=4, max_model_len=16, block_size=4, vocab_size=50, device=torch.device("cpu"))
    batch.add_request(state(0, 3, top_k=2**63 - 1))
    batch.add_request(state(1, 3, top_k=50))
    assert batch.top_k[:2].tolist() == [50, 50]
    assert batch.make_sampling_metadata(np.array([0, 1])).top_k is None
    batch.add_request(state(2, 3, top_k=7))
    md = batch.make_sampling_metadata(np.array([0, 2]))
    assert md.top_k.tolist() == [50, 7] and md.max_top_k == 7  # read on the host: top-k needs no sync


def test_a_temperature_below_the_samplers_epsilon_is_greedy_in_the_metadata():
    """The Sampler treats rows below SAMPLING_EPS as greedy (``SamplingParams.greedy``); so must
    ``all_greedy`` / ``all_random``, or a batch counted "all random" would sample such a row at
    temperature 1e-7 (overflow) instead."""
    batch = InputBatch(max_num_reqs=4, max_model_len=16, block_size=4, vocab_size=50, device=torch.device("cpu"))
    batch.add_request(state(0, 3, temperature=1e-7))
    batch.add_request(state(1, 3, temperature=0.7))
    assert batch.make_sampling_metadata(np.array([0])).all_greedy
    md = batch.make_sampling_metadata(np.array([0, 1]))
    assert not md.all_greedy and not md.all_random
    assert batch.make_sampling_metadata(np.array([1])).all_random
