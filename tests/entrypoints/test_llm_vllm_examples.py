"""Snippets in the manner of vLLM's offline-inference examples and docs (examples/offline_inference/
basic/basic.py and chat.py, the prompt-forms, sampling-parameters and chat docs), written for this
project with ``vllm`` -> ``tracevllm`` and the bundled model; each runs unchanged, on its own."""

from __future__ import annotations

import textwrap

import pytest

pytestmark = pytest.mark.slow

SNIPPETS = {
    "basic": """
        from tracevllm import LLM, SamplingParams

        prompts = [
            "Hello, my name is",
            "The president of the United States is",
            "The capital of France is",
            "The future of AI is",
        ]
        sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
        llm = LLM(dtype="float32", max_model_len=512)
        outputs = llm.generate(prompts, sampling_params)
        for output in outputs:
            prompt = output.prompt
            generated_text = output.outputs[0].text
            print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
        assert [o.prompt for o in outputs] == prompts
    """,
    "chat": """
        from tracevllm import LLM, SamplingParams

        llm = LLM(dtype="float32", max_model_len=512)
        sampling_params = SamplingParams(max_tokens=16, temperature=0.7, top_p=0.9, top_k=50)

        def print_outputs(outputs):
            for output in outputs:
                print(f"Prompt: {output.prompt!r}")
                print(f"Generated text: {output.outputs[0].text!r}")
            print("-" * 80)

        conversation = [
            {"role": "system", "content": "You are a helpful assistant"},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hello! How can I assist you today?"},
            {"role": "user", "content": "Write an essay about the importance of higher education."},
        ]
        outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
        print_outputs(outputs)
        conversations = [conversation for _ in range(10)]
        outputs = llm.chat(conversations, sampling_params, use_tqdm=True)
        print_outputs(outputs)
        chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}assistant:"
        outputs = llm.chat(conversations, sampling_params, use_tqdm=False, chat_template=chat_template)
        assert len(outputs) == 10 and outputs[0].prompt.endswith("assistant:")
    """,
    "prompt forms": """
        from tracevllm import LLM
        from tracevllm.inputs import TextPrompt, TokensPrompt

        llm = LLM(dtype="float32", max_model_len=512)
        tokenizer = llm.get_tokenizer()
        prompt_token_ids = tokenizer.encode("Hello, my name is")
        outputs = llm.generate(TokensPrompt(prompt_token_ids=prompt_token_ids))
        outputs += llm.generate(TextPrompt(prompt="Hello, my name is"))
        outputs += llm.generate([{"prompt": "The capital of France is"}, {"prompt_token_ids": prompt_token_ids}])
        for output in outputs:
            print(output.prompt_token_ids, output.outputs[0].text)
        assert outputs[1].prompt_token_ids == outputs[0].prompt_token_ids == prompt_token_ids
    """,
    "sampling parameters": """
        from tracevllm import LLM, SamplingParams

        llm = LLM(dtype="float32", max_model_len=512, gpu_memory_utilization=0.8, enforce_eager=True, tensor_parallel_size=1)
        params = SamplingParams(temperature=0, max_tokens=32, stop=["\\n\\n"], logprobs=5, bad_words=["Paris"],
                                seed=42, skip_special_tokens=True, spaces_between_special_tokens=True)
        output = llm.generate("The capital of France is", params)[0]
        completion = output.outputs[0]
        print(completion.text, completion.finish_reason, completion.cumulative_logprob)
        for position in completion.logprobs:
            for token_id, logprob in position.items():
                print(token_id, logprob.decoded_token, logprob.logprob, logprob.rank)
        assert "Paris" not in completion.text
        ids_only = llm.generate("The capital of France is", SamplingParams(max_tokens=8, detokenize=False))[0]
        assert ids_only.outputs[0].text == "" and len(ids_only.outputs[0].token_ids) == 8
        short = llm.generate("one two three four five", SamplingParams(max_tokens=4, truncate_prompt_tokens=2))[0]
        assert len(short.prompt_token_ids) == 2
    """,
    "chat features": """
        from tracevllm import LLM, SamplingParams

        llm = LLM(dtype="float32", max_model_len=512)
        sampling_params = SamplingParams(temperature=0, max_tokens=16)
        messages = [{"role": "user", "content": [{"type": "text", "text": "Tell me a joke about cats."}]}]
        print(llm.chat(messages, sampling_params)[0].outputs[0].text)
        messages = [
            {"role": "user", "content": "Tell me a joke about cats."},
            {"role": "assistant", "content": "Why did the cat"},
        ]
        outputs = llm.chat(messages, sampling_params, add_generation_prompt=False, continue_final_message=True)
        print("Why did the cat" + outputs[0].outputs[0].text)
        assert outputs[0].prompt.endswith("Why did the cat")
    """,
}


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_vllm_snippet_runs_unchanged(bundled_model_dir, name, capsys):
    exec(compile(textwrap.dedent(SNIPPETS[name]), f"<vllm snippet: {name}>", "exec"), {})
    assert capsys.readouterr().out.strip()
