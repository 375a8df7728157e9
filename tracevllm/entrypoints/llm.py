"""LLM: the offline entry point. ``LLM().generate(prompts)`` runs every request to completion."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from tracevllm.engine.arg_utils import EngineArgs
from tracevllm.engine.llm_engine import LLMEngine
from tracevllm.entrypoints.chat_utils import apply_chat_template, parse_chat_messages
from tracevllm.inputs import PromptType, parse_prompts
from tracevllm.outputs import RequestOutput
from tracevllm.sampling_params import RequestOutputKind, SamplingParams


class LLM:
    """An engine for offline batched generation.

    ``LLM(model, **options)``: the options are EngineArgs' fields (tracevllm/engine/arg_utils.py, where
    each has its help; the CLI's engine flags are the same, ``tracevllm serve --help``), and an unknown
    one is a ValueError. ``model`` is a local Hugging Face directory, a ``.gguf`` file, or None /
    ``"smollm2"`` for the bundled SmolLM2-135M-Instruct; nothing is downloaded. Common options:
    ``dtype`` ("auto" or a float type: ``ModelDType``), ``max_model_len``, ``device``, ``seed``;
    the KV cache gets ``num_gpu_blocks_override`` blocks of ``block_size`` tokens if given, else as many as
    ``kv_cache_memory_bytes`` holds (default: 1 GiB on CPU; on CUDA what the loaded model leaves of
    ``gpu_memory_utilization`` x the GPU's total memory, as in vLLM, or if that is not given 90 % of
    the memory free after loading);
    ``enforce_eager=True`` captures no CUDA graphs (on CUDA, decode steps replay them by default);
    ``tensor_parallel_size`` and ``pipeline_parallel_size`` split the model over that many ranks,
    run by ``distributed_executor_backend`` ("mp": worker processes, the default; "ray": Ray actors);
    ``trace_out`` (a directory) or ``otlp_traces_endpoint`` turns tracing on. ``multiprocess=True``,
    the one option of LLM's own, runs the engine core in a background process (as the server does)
    instead of in this one.
    """

    def __init__(self, model: str | None = None, *, multiprocess: bool = False, **options: Any) -> None:
        engine_args = EngineArgs.from_options({"model": model, **options}, "LLM()", other_names=["multiprocess"])
        self.llm_engine = LLMEngine.from_engine_args(engine_args, multiprocess_mode=multiprocess)
        self.request_counter = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, multiprocess: bool = False) -> LLM:
        """An LLM with these options (e.g. ``EngineArgs.from_cli_args(args)``)."""
        return cls(**dataclasses.asdict(engine_args), multiprocess=multiprocess)

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs in input order.

        A prompt is a string, a ``TextPrompt`` (``{"prompt": str}``), a ``TokensPrompt``
        (``{"prompt_token_ids": list[int]}``) or a list of token ids (tracevllm/inputs); ``prompts`` is
        one prompt or a list of them. All prompts are validated before any is queued: a bad one
        raises ValueError and leaves the engine untouched.
        """
        return self._generate(prompts, sampling_params, use_tqdm, priority, add_special_tokens=True)

    def _generate(self, prompts, sampling_params, use_tqdm: bool, priority: list[int] | None,
                  add_special_tokens: bool, conversations: list[list[dict]] | None = None) -> list[RequestOutput]:
        prompts = parse_prompts(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params_list = (
            [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        )
        if len(params_list) != len(prompts):
            raise ValueError(
                f"sampling_params must be one SamplingParams or one per prompt ({len(prompts)}), "
                f"got {len(params_list)}."
            )
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority must have one entry per prompt ({len(prompts)}), got {len(priority)}.")

        engine = self.llm_engine
        processed = []
        for i, (prompt, params) in enumerate(zip(prompts, params_list)):
            params = params.clone(output_kind=RequestOutputKind.FINAL_ONLY)
            request_id = str(next(self.request_counter))
            processed.append(engine.process_request(
                request_id, prompt, params, priority[i] if priority else 0, add_special_tokens,
                conversations[i] if conversations is not None else None,
            ))
        for parent, requests in processed:
            engine.add_processed_request(parent, requests)
        return self._run_engine(use_tqdm, [parent.request_id for parent, _ in processed])

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the tokenizer's chat
        template (or ``chat_template``, a Jinja template string).

        A message's content is a string or a list of text parts (``{"type": "text", "text": ...}``,
        joined with newlines). ``add_generation_prompt`` opens a new assistant turn after the last
        message; ``continue_final_message`` (with ``add_generation_prompt=False``) leaves the last
        message open for the model to go on with; both is a ValueError, as in vLLM.
        """
        if not isinstance(messages, Sequence) or isinstance(messages, str):
            raise ValueError("messages must be a conversation (a list of {'role': ..., 'content': ...} dicts) or a "
                             f"list of conversations, got {type(messages).__name__}.")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.get_tokenizer()
        parsed = [parse_chat_messages(conversation) for conversation in conversations]  # type: ignore[arg-type]
        prompts = [
            apply_chat_template(
                tokenizer, conversation, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, chat_template_kwargs=chat_template_kwargs,
            )
            for conversation in parsed
        ]
        # The template already wrote the special tokens (a BOS, if the model has one): the tokenizer
        # must not add them again, or the prompt would start with two BOS, unlike in training.
        return self._generate(prompts, sampling_params, use_tqdm, None, add_special_tokens=False,
                              conversations=parsed)

    def _run_engine(self, use_tqdm: bool, request_ids: list[str]) -> list[RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", dynamic_ncols=True, disable=not use_tqdm)
        num_out_tokens = 0
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
                    num_out_tokens += sum(len(o.token_ids) for o in output.outputs)
                    elapsed = bar.format_dict["elapsed"] or 1e-9
                    bar.set_postfix_str(f"output: {num_out_tokens / elapsed:.1f} toks/s", refresh=False)
                    bar.update(1)
        bar.close()
        return [finished[r] for r in request_ids if r in finished]
