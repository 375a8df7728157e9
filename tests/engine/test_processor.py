"""The Processor's checks that need the model or its tokenizer, and its lazy fan-out of n samples.

No engine runs here: a Processor needs only the config and the tokenizer.
"""

from __future__ import annotations

import pytest

from tracevllm import SamplingParams
from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.engine.processor import Processor, child_seed
from tracevllm.models.loader import get_tokenizer


@pytest.fixture(scope="module")
def processor(tiny_checkpoint) -> Processor:
    config = EngineArgs(model=tiny_checkpoint("llama"), device="cpu", max_model_len=64).create_engine_config()
    return Processor(config, get_tokenizer(config.model_config.model))


def test_children_are_made_on_demand_with_seeds_in_the_int64_range(processor):
    parent, children = processor.process_request("r", "Hello", SamplingParams(n=3, seed=2**63 - 1))
    assert len(children) == 3 and parent.request_id == "r"
    assert [c.request_id for c in children] == ["0_r", "1_r", "2_r"]
    assert [c.sampling_params.seed for c in children] == [2**63 - 1, -(2**63), -(2**63) + 1]
    assert all(c.sampling_params.n == 1 for c in children)
    assert [c.request_id for c in children[1:]] == ["1_r", "2_r"]
    # A huge n costs nothing until its samples are asked for.
    _, many = processor.process_request("m", "Hello", SamplingParams(n=2**62, seed=5))
    assert len(many) == 2**62 and many[10**12].request_id == f"{10**12}_m"
    assert many[-1].sampling_params.seed == child_seed(5, 2**62 - 1) == 5 + 2**62 - 1
    # n = 1: the one request keeps its own id and seed.
    _, (only,) = processor.process_request("s", "Hello", SamplingParams(seed=-1))
    assert only.request_id == "s" and only.sampling_params.seed is None


def test_child_seed_wraps_two_complement():
    assert child_seed(0, 3) == 3
    assert child_seed(-5, 2) == -3
    assert child_seed(2**63 - 2, 3) == -(2**63) + 1


def test_top_k_and_stop_token_ids_are_bounded_by_the_vocabulary(processor):
    vocab = processor.vocab_size
    processor.process_inputs("ok", "Hi", SamplingParams(top_k=vocab, stop_token_ids=[0, vocab - 1]))
    with pytest.raises(ValueError, match=rf"top_k must be -1 \(disabled\) or in \[1, {vocab}\], got {vocab + 1}"):
        processor.process_inputs("k", "Hi", SamplingParams(top_k=vocab + 1))
    with pytest.raises(ValueError, match=rf"stop_token_ids must be token ids in \[0, {vocab}\), got {vocab}"):
        processor.process_inputs("s", "Hi", SamplingParams(stop_token_ids=[3, vocab]))


def test_prompt_byte_bound_is_checked_before_tokenizing(processor, monkeypatch):
    assert processor.max_prompt_bytes == 64 * processor.max_token_bytes
    processor.check_prompt_bytes("x" * processor.max_prompt_bytes)  # at the bound: may fit, so allowed
    processor.process_inputs("ok", "The capital of France is", SamplingParams())

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized a prompt that cannot fit")

    monkeypatch.setattr(processor.tokenizer, "encode", no_tokenizing)
    over = "é" * (processor.max_prompt_bytes // 2 + 1)  # 2 bytes a character: just over the bound
    message = (rf"The prompt is {processor.max_prompt_bytes + 2} bytes long; max_model_len \(64\) tokens of this "
               rf"tokenizer hold at most {processor.max_prompt_bytes} bytes \({processor.max_token_bytes} bytes per "
               rf"token\), so it cannot fit\.")
    with pytest.raises(ValueError, match=message):
        processor.process_inputs("long", over, SamplingParams())


@pytest.mark.parametrize("text", [
    " " * 4000, "\n" + " " * 300, "é" * 500, "😀" * 300, "中文字符" * 200, "<|im_start|>" * 50,
    "".join(chr(c) for c in range(32, 3000)), "a" * 5000,
])
def test_max_token_bytes_bounds_every_token(processor, text):
    """Byte-level BPE: a text's bytes never exceed its tokens times the bound."""
    num_tokens = len(processor.tokenizer.encode(text, add_special_tokens=False))
    assert len(text.encode()) <= num_tokens * processor.max_token_bytes
