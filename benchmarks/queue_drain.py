"""Queue drain: the engine's bookkeeping per request, with a short queue and with a long one.

    python benchmarks/queue_drain.py --num-requests 100 100000

For each N, N one-token requests (``max_tokens=1``, distinct 8-token prompts) are queued in a
``Scheduler`` and drained by a fake model that samples token 7 for every request that caught up:
no forward pass, so what is timed is the scheduler, the KV cache manager and the per-step stats,
i.e. the costs that used to grow with the queue. It prints the drain rate (requests per second) and
the cost of aborting a request from the middle of the queue (``Scheduler.finish_requests``). Both
should be about the same for N=100 and N=100,000: every per-request operation is O(1) or O(log N).
Times are this process's CPU time, so that other work on a shared machine does not count.
"""

from __future__ import annotations

import argparse
import time

import torch

from tracevllm.config import CacheConfig, SchedulerConfig
from tracevllm.core.sched.scheduler import Scheduler
from tracevllm.request import Request, RequestStatus
from tracevllm.sampling_params import SamplingParams
from tracevllm.model_runner_output import ModelRunnerOutput, SamplerOutput

PROMPT_LEN = 8


def make_scheduler(policy: str) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=1024, policy=policy),
        CacheConfig(block_size=16, num_gpu_blocks=4096),
    )


def fill(scheduler: Scheduler, num_requests: int, params: SamplingParams) -> list[Request]:
    requests = [
        Request(f"r{i}", [100 + (i + j) % 40000 for j in range(PROMPT_LEN)], params, None, float(i),
                priority=i % 3)
        for i in range(num_requests)
    ]
    for request in requests:
        scheduler.add_request(request)
    return requests


def step(scheduler: Scheduler) -> None:
    """schedule() and a fake model: every request that caught up samples token 7."""
    out = scheduler.schedule()
    sampling = [r for r in out.num_scheduled_tokens
                if scheduler.requests[r].num_computed_tokens == scheduler.requests[r].num_tokens]
    model_output = ModelRunnerOutput(req_ids=list(out.num_scheduled_tokens), sampling_req_ids=sampling, logits=None)
    scheduler.update_from_output(out, model_output, SamplerOutput(torch.full((len(sampling),), 7), None))


def measure(num_requests: int, policy: str, num_aborts: int) -> tuple[float, float]:
    """(drain rate in requests per CPU second, CPU microseconds per abort from the middle of the
    queue), over enough rounds to drain at least 10,000 requests."""
    params = SamplingParams(max_tokens=1)
    drain_s = abort_s = 0.0
    rounds = max(1, 10_000 // num_requests)
    for _ in range(rounds):
        scheduler = make_scheduler(policy)
        requests = fill(scheduler, num_requests + num_aborts, params)
        middle = requests[len(requests) // 2 - num_aborts // 2:][:num_aborts]
        start = time.process_time()
        scheduler.finish_requests([r.request_id for r in middle], RequestStatus.FINISHED_ABORTED)
        abort_s += time.process_time() - start
        start = time.process_time()
        while scheduler.has_unfinished_requests():
            step(scheduler)
        drain_s += time.process_time() - start
    return rounds * num_requests / drain_s, abort_s / max(rounds * num_aborts, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, nargs="+", default=[100, 100_000])
    parser.add_argument("--num-aborts", type=int, default=50, help="requests aborted from the middle first")
    parser.add_argument("--policy", nargs="+", default=["fcfs", "priority"], choices=("fcfs", "priority"))
    args = parser.parse_args()
    print(f"{'policy':<9} {'N':>9} {'drain (req/s)':>14} {'abort (us/req)':>15}")
    for policy in args.policy:
        for n in args.num_requests:
            rate, abort_us = measure(n, policy, args.num_aborts)
            print(f"{policy:<9} {n:>9} {rate:>14,.0f} {abort_us:>15.1f}", flush=True)


if __name__ == "__main__":
    main()
