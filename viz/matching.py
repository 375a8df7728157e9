"""Which request of run B is which request of run A, for ``traces diff``.

Two offline runs of one workload, or a run and its ``traces whatif`` prediction, have the same
engine-core request ids, and a request is matched by its id. A server's request ids are random, so two
served runs of one workload (``tracevllm bench serve`` twice, with one seed) share none. Then the
requests are matched by arrival: each of A's requests, in arrival order, with the first of B's not
yet matched that has the same prompt length, in arrival order (a server may see two requests sent at
once in either order). B's trace is then renamed to A's ids wherever an id appears (its steps, its
requests, their reasons), and the rest of the diff reads both as runs of one workload.

Runs that share some ids but not all are neither: ``match_requests`` leaves them to the id check,
which refuses them.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque

from viz.model import Request, Step, Trace


def match_requests(a: Trace, b: Trace) -> dict[str, str] | None:
    """B's request id -> A's, when the two runs share no id and every request of each finds one of
    the other by arrival and prompt length; None otherwise (match by id)."""
    if a.requests.keys() & b.requests.keys() or len(a.requests) != len(b.requests) or not a.requests:
        return None
    unmatched: dict[int, deque[str]] = defaultdict(deque)
    for request in b.requests.values():  # in arrival order
        unmatched[request.num_prompt_tokens].append(request.request_id)
    names = {}
    for request in a.requests.values():
        candidates = unmatched.get(request.num_prompt_tokens)
        if not candidates:
            return None
        names[candidates.popleft()] = request.request_id
    return names


def renamed(trace: Trace, names: dict[str, str]) -> Trace:
    """``trace`` with every request id in ``names`` replaced by its new name (others kept)."""
    def rename(request_id: str | None) -> str | None:
        return names.get(request_id, request_id) if request_id is not None else None

    def rename_keys(held: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return {rename(r): blocks for r, blocks in held.items()}

    def step(s: Step) -> Step:
        return dataclasses.replace(
            s, req_ids=tuple(map(rename, s.req_ids)), preempted_req_ids=tuple(map(rename, s.preempted_req_ids)),
            blocks_allocated=rename_keys(s.blocks_allocated), blocks_freed=rename_keys(s.blocks_freed),
            prefix_hits=rename_keys(s.prefix_hits), blocks_held=rename_keys(s.blocks_held))

    def request(r: Request) -> Request:
        return dataclasses.replace(
            r, request_id=rename(r.request_id),
            waits=tuple(dataclasses.replace(w, blocked_by=tuple(map(rename, w.blocked_by))) for w in r.waits),
            preempted=tuple(dataclasses.replace(p, forced_by=rename(p.forced_by)) for p in r.preempted),
            admissions=tuple(dataclasses.replace(x, miss_evicted_for=rename(x.miss_evicted_for))
                             for x in r.admissions))

    return dataclasses.replace(trace, requests={rename(k): request(r) for k, r in trace.requests.items()},
                               steps=tuple(map(step, trace.steps)))
