"""End to end on the bundled SmolLM2-135M-Instruct: greedy tokens identical to transformers' generate.

The reference is transformers' own model on the same (converted) weights, float32, CPU, one prompt
at a time (no padding). Its generation config loses its EOS id, which is what ``ignore_eos`` means:
EOS may be generated but does not stop (``min_new_tokens`` would instead forbid EOS).
"""

from __future__ import annotations

import pytest
import torch

from tracevllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

NEW_TOKENS = 48
LONG_STORY = " ".join(
    f"Chapter {i}: the engineer opened file number {i * 7 % 13}, read the scheduler, and wrote a note "
    f"about block {i * 3} before moving on." for i in range(30)
)


def make_prompts(tokenizer) -> list[str]:
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Give me three tips for writing readable Python code."}],
        tokenize=False, add_generation_prompt=True,
    )
    return [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "请用一句话介绍一下长城。",
        chat,
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        LONG_STORY + "\nSummary of the chapters above:",
        "1, 2, 3, 5, 8, 13,",
        "Q: What is a KV cache in a transformer?\nA:",
    ]


@pytest.fixture(scope="module")
def hf_model(bundled_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(bundled_model_dir, dtype=torch.float32, local_files_only=True)
    model.generation_config.eos_token_id = None
    return model.eval()


@pytest.fixture(scope="module")
def prompt_ids(bundled_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir, local_files_only=True)
    ids = [tokenizer.encode(p) for p in make_prompts(tokenizer)]
    assert max(len(i) for i in ids) > 500
    return ids


@pytest.fixture(scope="module")
def hf_reference(hf_model, prompt_ids) -> list[list[int]]:
    refs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            out = hf_model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0,
            )
            refs.append(out[0, len(ids):].tolist())
    return refs


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
# On a CUDA machine both GPU attention backends run the model (on a CPU the Triton kernel would run
# under the interpreter, far too slowly for a 135M model: its own tests cover it there). On a CPU,
# the engine's own choice: the cpu backend, or with TRACEVLLM_DISABLE_OPTIMIZATIONS=all the torch one.
BACKENDS = ["torch", "triton"] if torch.cuda.is_available() else ["auto"]
KV_BYTES = 1 << 30  # not 90 % of a GPU's free memory for each of the engines alive at once


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def llm(bundled_model_dir, backend):
    return LLM(dtype="float32", max_model_len=2048, seed=0, attention_backend=backend, kv_cache_memory_bytes=KV_BYTES)


def test_greedy_batch_matches_transformers(llm, prompt_ids, hf_reference):
    outputs = llm.generate(prompt_ids, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_reference
    for o in outputs:
        assert o.finished and o.outputs[0].finish_reason == "length"
        m = o.metrics
        assert m.arrival_time <= m.queued_ts <= m.scheduled_ts <= m.first_token_ts <= m.last_token_ts <= m.finished_ts


def test_text_prompts_and_detokenized_text(llm, bundled_model_dir, prompt_ids, hf_reference):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir, local_files_only=True)
    prompts = make_prompts(tokenizer)[:3]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for o, prompt, ref in zip(outputs, prompts, hf_reference):
        assert o.prompt == prompt and o.prompt_token_ids == tokenizer.encode(prompt)
        assert o.outputs[0].token_ids == ref
        assert o.outputs[0].text == tokenizer.decode(ref, skip_special_tokens=True)


def test_prefix_caching_shared_prefix(llm, prompt_ids, hf_reference):
    long_ids, long_ref = prompt_ids[5], hf_reference[5]
    first = llm.generate([long_ids], GREEDY, use_tqdm=False)[0]
    second = llm.generate([long_ids], GREEDY, use_tqdm=False)[0]
    assert first.outputs[0].token_ids == long_ref == second.outputs[0].token_ids
    assert second.num_cached_tokens > 0
    assert second.num_cached_tokens < len(long_ids)  # the last prompt token is always recomputed


def test_chunked_prefill_matches(bundled_model_dir, backend, prompt_ids, hf_reference):
    llm = LLM(dtype="float32", max_model_len=2048, max_num_batched_tokens=64, max_num_seqs=8,
              attention_backend=backend, kv_cache_memory_bytes=KV_BYTES)
    outputs = llm.generate(prompt_ids, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_reference


def test_kv_exhaustion_preempts_and_still_matches(bundled_model_dir, backend, prompt_ids, hf_reference, tmp_path):
    import json

    from tracevllm.tracing import flush_traces

    # 64 blocks x 16 = 1024 tokens (65 blocks with the null block), against ~1,700 tokens for all requests
    # together: the long prompt alone needs 60 blocks, so running requests must be preempted to make room.
    llm = LLM(dtype="float32", max_model_len=1024, num_gpu_blocks_override=65, trace_out=str(tmp_path),
              attention_backend=backend)
    outputs = llm.generate(prompt_ids, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == hf_reference
    kv = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager
    assert kv.num_free_blocks == 64
    flush_traces()
    events = []
    for path in tmp_path.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        events += [e["name"] for e in span.get("events", []) if span["name"] == "scheduler.request"]
    assert "PREEMPTED" in events
