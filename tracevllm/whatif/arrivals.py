"""When the replay's requests arrive: the recorded arrivals, at another rate, or resampled to another
number of requests.

A user request (its ``n`` samples, the engine-core requests ``viz/workload.py`` reads back) reaches the
front end at ``arrival``, which hands it to the engine core at ``queued`` (once tokenized; the engine core
queues it at its next step boundary, which the replay finds itself). The replay keeps both:

- ``--arrival-scale X`` divides the time between arrivals by X (X = 2: twice the rate), from the
  first arrival on; the front end's own delay (``queued - arrival``) stays as recorded;
- ``--num-requests N`` draws N user requests from the recorded ones (with replacement, seeded), and
  the time between two arrivals from the recorded ones, so that the rate stays the recorded one
  (with ``--arrival-scale`` too: "ten times the traffic" is ``--num-requests 10N --arrival-scale 10``).
  A drawn copy keeps the prompt blocks its original shared with other requests (a system prompt, say)
  and gets blocks of its own for the rest, so that copies do not hit each other's prompts in the
  prefix cache as no two different users' questions would. Its ids are ``"{i}-{original id}"``.

An offline run adds all its prompts, then steps: its first step starts after its last request is
queued. ``first_step`` keeps that: the replay's first step waits until as many requests are queued as
were before the recorded one (all of them, when all were: an offline run, however many it has now),
and as long after as it was.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from viz.workload import RecordedRequest


@dataclass(frozen=True, slots=True)
class Arrival:
    """One user request: its ``samples`` (engine-core requests, in the order they were queued)."""

    request_id: str
    samples: tuple[RecordedRequest, ...]
    arrival: float
    queued: float


@dataclass(frozen=True)
class ArrivalPlan:
    arrivals: tuple[Arrival, ...]  # in queued order
    first_queued: float  # when the requests of the first step are all handed over
    first_step: float  # when the first step starts


def plan_arrivals(workload: Sequence[RecordedRequest], first_step: float, arrival_scale: float = 1.0,
                  num_requests: int | None = None, seed: int = 0) -> ArrivalPlan:
    """The arrivals of ``workload`` (recorded, its first step at ``first_step``), scaled and resampled."""
    if arrival_scale <= 0:
        raise ValueError(f"--arrival-scale must be > 0, got {arrival_scale}")
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"--num-requests must be >= 1, got {num_requests}")
    users = _user_requests(workload)
    before_first_step = max(1, sum(u.queued <= first_step for u in users))
    lead = max(0.0, first_step - users[before_first_step - 1].queued)
    if num_requests is not None:
        offline = before_first_step == len(users)  # every request was queued before the first step
        before_first_step = num_requests if offline else min(before_first_step, num_requests)
        users = _resample(users, num_requests, random.Random(seed))
    start = users[0].arrival
    scaled = [replace(u, arrival=start + (u.arrival - start) / arrival_scale,
                      queued=start + (u.arrival - start) / arrival_scale + (u.queued - u.arrival)) for u in users]
    scaled.sort(key=lambda u: u.queued)
    first_queued = scaled[min(before_first_step, len(scaled)) - 1].queued
    return ArrivalPlan(tuple(scaled), first_queued, first_queued + lead)


def _user_requests(workload: Sequence[RecordedRequest]) -> list[Arrival]:
    samples: dict[str, list[RecordedRequest]] = {}
    for r in sorted(workload, key=lambda r: (r.queued, r.arrival)):
        samples.setdefault(r.parent_request_id, []).append(r)
    users = [Arrival(parent, tuple(s), min(r.arrival for r in s), min(r.queued for r in s))
             for parent, s in samples.items()]
    return sorted(users, key=lambda u: (u.arrival, u.queued))


def _resample(users: list[Arrival], n: int, rng: random.Random) -> list[Arrival]:
    """``n`` copies of users drawn with replacement, spaced by recorded inter-arrival times."""
    gaps = [b.arrival - a.arrival for a, b in zip(users, users[1:])] or [0.0]
    # Prompt blocks more than one user request has: kept by a copy; the rest are its own.
    shared = {h for h, count in Counter(h for u in users for h in set(u.samples[0].prompt_block_hashes)).items()
              if count > 1}
    copies, arrival = [], users[0].arrival
    for i in range(n):
        user = rng.choice(users)
        if i:
            arrival += rng.choice(gaps)
        parent = f"{i}-{user.request_id}"
        samples = tuple(replace(
            r, request_id=f"{i}-{r.request_id}" if r.request_id == user.request_id else
            f"{r.request_id.split('_', 1)[0]}_{parent}",
            parent_request_id=parent, prompt_block_hashes=_own_blocks(r.prompt_block_hashes, shared, i))
            for r in user.samples)
        copies.append(Arrival(parent, samples, arrival, arrival + (user.queued - user.arrival)))
    return copies


def _own_blocks(hashes: Sequence[str], shared: set[str], copy: int) -> tuple[str, ...]:
    """The shared first blocks as they are, then blocks of the copy's own (hashes chain: after the
    first block of its own, every later block is its own too)."""
    keep = next((i for i, h in enumerate(hashes) if h not in shared), len(hashes))
    return tuple(hashes[:keep]) + tuple(f"{h}-{copy}" for h in hashes[keep:])
