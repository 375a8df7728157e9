"""vLLM's steps beside tracevllm's: how many are the same, where they first part, and which rule.

Two steps are the same when the scheduler and the KV cache decided the same (``GoldenStep.decisions``):
the same requests with the same token counts, the same admissions with the same prefix-cache hits,
the same preemptions in the same order, the same new blocks, the same finishes, the same free blocks
after. Steps are compared by number; after the first difference, later ones may only follow from it.

At the first difference the decision that differs names the rule that decides it (``RULES``), the
first thing to read in ``core/sched/scheduler.py`` and ``core/kv_cache_manager.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tracevllm.parity.golden import GoldenSchedule, GoldenStep

# Each decision, in the order a difference is looked for, with the rule of vLLM's that makes it.
RULES: dict[str, str] = {
    "admitted": "admission: waiting requests in queue order, none in a step that preempted, each only if the free "
                "blocks hold its whole prompt (scheduler_reserve_full_isl) beyond the watermark, within "
                "max_num_seqs and the token budget",
    "prefix_hits": "the prefix cache: whole blocks only, never the last token, and which cached blocks are still "
                   "there (a freed block without a cached hash is reused first, a cached one last)",
    "preempted": "preemption: when allocate_slots fails, the victim is the newest running request (fcfs) or the "
                 "largest (priority, arrival) (priority); a request that preempts itself ends the step's running "
                 "loop",
    "scheduled": "who runs with how many tokens: running requests first, each with what the budget leaves (capped "
                 "at long_prefill_token_threshold unless it is the only request), until one preempts itself; "
                 "scheduling asynchronously, a token in flight counts as a placeholder, and a request whose token "
                 "in flight is sure to be its last (max_tokens) is not scheduled",
    "finished": "stopping (check_stop): EOS, then a stop token, then max_tokens or max_model_len",
    "new_block_ids": "the block pool: block 0 is the null block; the free queue hands out its head, where freed "
                     "blocks without a cached hash go, cached ones joining its tail",
    "num_free_blocks": "counting free blocks: the null block is never free; a prefix hit takes a free cached block "
                       "off the free queue; scheduling asynchronously, they are counted once the step's output is "
                       "applied, after the next step was scheduled",
}


def _differing(vllm: GoldenStep | None, ours: GoldenStep | None) -> list[str]:
    """The decisions (``RULES``' keys) two steps make differently, in ``RULES``' order."""
    if vllm is None or ours is None:
        return ["scheduled"]
    a, b = vllm.decisions(), ours.decisions()
    hits = [{x.request_id: (x.num_cached_tokens, x.resumed) for x in s.admitted} for s in (vllm, ours)]
    out = []
    if hits[0].keys() != hits[1].keys():
        out.append("admitted")
    elif hits[0] != hits[1]:
        out.append("prefix_hits")
    out += [k for k in ("preempted", "scheduled", "finished", "new_block_ids", "num_free_blocks") if a[k] != b[k]]
    return out


@dataclass(frozen=True)
class Divergence:
    """The first step number whose decisions differ (a step one engine did not make is None)."""

    number: int
    vllm: GoldenStep | None
    ours: GoldenStep | None
    differing: list[str]

    @property
    def rule(self) -> str:
        return RULES[self.differing[0]]


@dataclass(frozen=True)
class ParityReport:
    golden: GoldenSchedule
    steps: list[GoldenStep]  # tracevllm's
    num_same: int  # step numbers whose decisions are the same in both
    divergence: Divergence | None

    @property
    def num_steps(self) -> int:
        return max(len(self.golden.steps), len(self.steps))

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def as_dict(self) -> dict[str, Any]:
        d = self.divergence
        return {"golden": self.golden.path, "scenario": self.golden.scenario, "vllm_version": self.golden.vllm_version,
                "num_steps_vllm": len(self.golden.steps), "num_steps_tracevllm": len(self.steps),
                "num_same": self.num_same, "identical": self.identical,
                "divergence": None if d is None else {
                    "step": d.number, "differing": d.differing, "rule": d.rule,
                    "vllm": None if d.vllm is None else _decisions(d.vllm),
                    "tracevllm": None if d.ours is None else _decisions(d.ours)}}

    def describe(self) -> str:
        g = self.golden
        head = (f"{g.path or g.scenario}: vLLM {g.vllm_version} took {len(g.steps)} steps, tracevllm "
                f"{len(self.steps)}; {self.num_same} of {self.num_steps} the same")
        d = self.divergence
        if d is None:
            return f"{head}: the same schedule, step for step"
        lines = [head, f"first divergent step: {d.number} ({', '.join(d.differing)} differ)",
                 f"  vLLM:      {describe_step(d.vllm)}", f"  tracevllm: {describe_step(d.ours)}",
                 f"  the rule involved: {d.rule}"]
        return "\n".join(lines)


def _decisions(step: GoldenStep) -> dict[str, Any]:
    return {**step.decisions(), "admitted": [asdict(a) for a in step.admitted]}


def describe_step(step: GoldenStep | None) -> str:
    """A step's decisions on one line."""
    if step is None:
        return "(no such step)"
    admitted = ", ".join(f"{a.request_id}{' resumed' if a.resumed else ''} ({a.num_cached_tokens} cached)"
                         for a in step.admitted) or "-"
    finished = ", ".join(f"{r} {why}" for r, why in step.finished.items()) or "-"
    blocks = ", ".join(f"{r} {ids}" for r, ids in step.new_block_ids.items()) or "-"
    return (f"scheduled {step.scheduled}; admitted {admitted}; preempted {', '.join(step.preempted) or '-'}; "
            f"finished {finished}; new blocks {blocks}; {step.num_free_blocks} free")


def compare(golden: GoldenSchedule, steps: list[GoldenStep]) -> ParityReport:
    """tracevllm's ``steps`` of ``golden``'s workload held to vLLM's, step number by step number."""
    num_same, first = 0, None
    for i in range(max(len(golden.steps), len(steps))):
        vllm = golden.steps[i] if i < len(golden.steps) else None
        ours = steps[i] if i < len(steps) else None
        if differing := _differing(vllm, ours):
            first = first or Divergence(i + 1, vllm, ours, differing)
        else:
            num_same += 1
    return ParityReport(golden, steps, num_same, first)
