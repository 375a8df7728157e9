"""A golden schedule: what vLLM's own scheduler decided, step by step, on one workload.

``tests/parity/record_vllm.py`` runs a scenario through vLLM's engine core (in-process, its
``Scheduler`` subclassed to watch each step) and writes one JSON file::

    {"format": 1, "vllm_version": "0.32.0", "scenario": ..., "description": ...,
     "options": {...},          the scheduler's and the KV cache's options, vLLM's names (OPTIONS)
     "recorded_with": {...},    the rest of the run (model, dtype, machine): provenance only
     "requests": [...],         each engine request, its prompt, its sampling and what it produced
     "steps": [...]}            each call of Scheduler.schedule(), in order

A step is what one ``schedule()`` decided and what its ``update_from_output`` finished. Requests are
named by submission order (``r00``, ``r01``, ...; the samples of an ``n > 1`` request ``r03.0``,
``r03.1``), not by vLLM's ids, which carry a random suffix. The same record is made of a tracevllm
run (``parity/schedule_log.py``), so the two compare field by field (``parity/compare.py``).

The file is read back strictly: another format or vLLM version, an unknown option or a missing
field is a ``ValueError`` naming the file and the field. This module imports nothing but the
standard library: the recorder, which runs in vLLM's own virtual environment, writes with it.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

GOLDEN_FORMAT = 1
VLLM_VERSION = "0.32.0"  # the vLLM whose scheduler tracevllm follows

# The options a golden sets, with vLLM's names (its EngineArgs), and their types. tracevllm's
# EngineArgs has each under the same name.
OPTIONS: dict[str, type] = {
    "block_size": int,
    "num_gpu_blocks_override": int,
    "max_model_len": int,
    "max_num_batched_tokens": int,
    "max_num_seqs": int,
    "enable_prefix_caching": bool,
    "enable_chunked_prefill": bool,
    "long_prefill_token_threshold": int,
    "scheduling_policy": str,
    "scheduler_reserve_full_isl": bool,
    "watermark": float,
    "async_scheduling": bool,
}
FINISH_REASONS = ("stop", "length", "abort")


@dataclass(frozen=True, slots=True)
class GoldenRequest:
    """One engine request: what was asked (the prompt, the sampling that decides when it stops, its
    priority and arrival time), and what it produced (``output_token_ids``, ``finish_reason``).
    ``arrival_time`` is the one vLLM was given: it orders the requests as they were submitted (ties in
    the priority queue and the choice of a preemption victim depend on it), not a clock.
    ``parent_id``: the user request whose ``n`` samples this is one of (None for ``n == 1``)."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_time: float
    output_token_ids: list[int]
    finish_reason: str
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    eos_token_id: int | None = None
    priority: int = 0
    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """A request admitted from the waiting queue, new or ``resumed`` after a preemption, with the
    tokens its prefix-cache lookup found (``num_cached_tokens``)."""

    request_id: str
    num_cached_tokens: int
    resumed: bool


@dataclass(frozen=True, slots=True)
class GoldenStep:
    """One ``schedule()`` and the ``update_from_output`` after it.

    ``added`` and ``aborted``: what the driver did just before this step (they are part of the
    workload, not of the decisions). ``scheduled``: each scheduled request's tokens, in batch order;
    ``num_computed_tokens``: what each had computed before the step. ``new_block_ids``: the blocks each
    request gained (all of its blocks, for one just admitted). ``num_free_blocks``: free blocks once the
    step's finished requests are freed. ``start`` and ``end``: seconds since the first step began
    (the engine's wall clock; a replay does not compare them)."""

    number: int
    scheduled: dict[str, int]
    num_computed_tokens: dict[str, int]
    admitted: list[Admission]
    preempted: list[str]
    new_block_ids: dict[str, list[int]]
    finished: dict[str, str]
    num_free_blocks: int
    added: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    def decisions(self) -> dict[str, Any]:
        """What the scheduler and the KV cache decided: everything but the workload and the clock."""
        return {"scheduled": self.scheduled, "admitted": self.admitted, "preempted": self.preempted,
                "finished": self.finished, "new_block_ids": self.new_block_ids,
                "num_free_blocks": self.num_free_blocks}


@dataclass(frozen=True)
class GoldenSchedule:
    scenario: str
    description: str
    options: dict[str, Any]
    requests: list[GoldenRequest]
    steps: list[GoldenStep]
    vllm_version: str = VLLM_VERSION
    recorded_with: dict[str, Any] = field(default_factory=dict)
    path: str = ""  # where it was read from ("" when built in memory)

    @property
    def request_by_id(self) -> dict[str, GoldenRequest]:
        return {r.request_id: r for r in self.requests}

    def dump(self, path: str | Path) -> None:
        """Write the file: the header indented, one request or step per line (a diff of two
        recordings reads step by step)."""
        head = {"format": GOLDEN_FORMAT, "vllm_version": self.vllm_version, "scenario": self.scenario,
                "description": self.description, "options": self.options, "recorded_with": self.recorded_with}
        lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        for name, rows in (("requests", self.requests), ("steps", self.steps)):
            body = ",\n".join(f"  {json.dumps(_compact(asdict(row)))}" for row in rows)
            lines.append(f' "{name}": [\n{body}\n ]' + ("," if name == "requests" else ""))
        Path(path).write_text("\n".join(lines) + "\n}\n")


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    """A request's or step's fields without those at their defaults (the file stays small)."""
    defaults = {"min_tokens": 0, "ignore_eos": False, "stop_token_ids": [], "eos_token_id": None, "priority": 0,
                "parent_id": None, "added": [], "aborted": []}
    return {k: v for k, v in row.items() if k not in defaults or defaults[k] != v}


# ---- reading ------------------------------------------------------------------------------------

class _Reader:
    """Reads one file's JSON into the dataclasses above; each error names the file and the field."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, problem: str) -> ValueError:
        return ValueError(f"{self.path}: {where}: {problem}")

    def typed(self, where: str, value: Any, kind: type | tuple[type, ...]) -> Any:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise self.fail(where, f"must be {names}, got {json.dumps(value)}")
        return value

    def record(self, where: str, raw: Any, cls: type, convert: dict[str, Any]) -> Any:
        """``raw`` (a JSON object) as ``cls``: no unknown field, every field without a default present."""
        raw = self.typed(where, raw, dict)
        known = {f.name: f for f in fields(cls)}
        if unknown := sorted(raw.keys() - known.keys()):
            raise self.fail(f"{where}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")
        values = {}
        for name, f in known.items():
            if name not in raw:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise self.fail(f"{where}.{name}", "missing")
                continue
            values[name] = convert[name](f"{where}.{name}", raw[name]) if name in convert else raw[name]
        return cls(**values)

    def ints(self, where: str, value: Any) -> list[int]:
        return [self.typed(f"{where}[{i}]", v, int) for i, v in enumerate(self.typed(where, value, list))]

    def strs(self, where: str, value: Any) -> list[str]:
        return [self.typed(f"{where}[{i}]", v, str) for i, v in enumerate(self.typed(where, value, list))]

    def str_map(self, where: str, value: Any, kind: type) -> dict[str, Any]:
        return {k: self.typed(f"{where}.{k}", v, kind) for k, v in self.typed(where, value, dict).items()}

    def options(self, raw: Any) -> dict[str, Any]:
        raw = self.typed("options", raw, dict)
        for name, value in raw.items():
            if name not in OPTIONS:
                raise self.fail(f"options.{name}", f"unknown option (known: {', '.join(OPTIONS)})")
            raw[name] = self.typed(f"options.{name}", value, OPTIONS[name])
        return raw

    def request(self, i: int, raw: Any) -> GoldenRequest:
        where = f"requests[{i}]"
        t = self.typed
        request = self.record(where, raw, GoldenRequest, {
            "request_id": lambda w, v: t(w, v, str), "prompt_token_ids": self.ints,
            "max_tokens": lambda w, v: t(w, v, int), "arrival_time": lambda w, v: t(w, v, float),
            "output_token_ids": self.ints, "finish_reason": lambda w, v: t(w, v, str),
            "min_tokens": lambda w, v: t(w, v, int), "ignore_eos": lambda w, v: t(w, v, bool),
            "stop_token_ids": self.ints, "eos_token_id": lambda w, v: t(w, v, (int, type(None))),
            "priority": lambda w, v: t(w, v, int), "parent_id": lambda w, v: t(w, v, (str, type(None))),
        })
        if request.finish_reason not in FINISH_REASONS:
            raise self.fail(f"{where}.finish_reason", f"must be one of {', '.join(FINISH_REASONS)}, "
                                                      f"got {request.finish_reason!r}")
        return request

    def step(self, i: int, raw: Any) -> GoldenStep:
        where = f"steps[{i}]"
        t = self.typed

        def admissions(w: str, value: Any) -> list[Admission]:
            return [self.record(f"{w}[{j}]", a, Admission, {
                "request_id": lambda w2, v: t(w2, v, str), "num_cached_tokens": lambda w2, v: t(w2, v, int),
                "resumed": lambda w2, v: t(w2, v, bool)}) for j, a in enumerate(t(w, value, list))]

        step = self.record(where, raw, GoldenStep, {
            "number": lambda w, v: t(w, v, int),
            "scheduled": lambda w, v: self.str_map(w, v, int),
            "num_computed_tokens": lambda w, v: self.str_map(w, v, int),
            "admitted": admissions, "preempted": self.strs,
            "new_block_ids": lambda w, v: {k: self.ints(f"{w}.{k}", ids) for k, ids in t(w, v, dict).items()},
            "finished": lambda w, v: self.str_map(w, v, str),
            "num_free_blocks": lambda w, v: t(w, v, int),
            "added": self.strs, "aborted": self.strs,
            "start": lambda w, v: t(w, v, float), "end": lambda w, v: t(w, v, float),
        })
        if step.number != i + 1:
            raise self.fail(f"{where}.number", f"must be {i + 1} (steps are numbered from 1, in order), "
                                               f"got {step.number}")
        return step


def load_golden(path: str | Path) -> GoldenSchedule:
    """Read a golden schedule (ValueError naming the file and the field if it is not one this
    tracevllm reads: another format or vLLM version, an unknown option, a missing or mistyped field,
    a step that names a request the file does not have)."""
    path = str(path)
    reader = _Reader(path)
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a golden schedule: not JSON ({e})") from None
    raw = reader.typed("the file", raw, dict)
    if raw.get("format") != GOLDEN_FORMAT:
        raise reader.fail("format", f"must be {GOLDEN_FORMAT} (the golden-schedule format this tracevllm reads), "
                                    f"got {json.dumps(raw.get('format'))}")
    if raw.get("vllm_version") != VLLM_VERSION:
        raise reader.fail("vllm_version", f"recorded with vLLM {raw.get('vllm_version')}; tracevllm follows vLLM "
                                          f"{VLLM_VERSION}: record it again with tests/parity/record_vllm.py "
                                          f"under vLLM {VLLM_VERSION}")
    known = {"format", "vllm_version", "scenario", "description", "options", "recorded_with", "requests", "steps"}
    if unknown := sorted(raw.keys() - known):
        raise reader.fail(unknown[0], f"unknown field (known: {', '.join(sorted(known))})")
    for name in ("scenario", "options", "requests", "steps"):
        if name not in raw:
            raise reader.fail(name, "missing")
    requests = [reader.request(i, r) for i, r in enumerate(reader.typed("requests", raw["requests"], list))]
    steps = [reader.step(i, s) for i, s in enumerate(reader.typed("steps", raw["steps"], list))]
    golden = GoldenSchedule(
        reader.typed("scenario", raw["scenario"], str), reader.typed("description", raw.get("description", ""), str),
        reader.options(raw["options"]), requests, steps, VLLM_VERSION,
        reader.typed("recorded_with", raw.get("recorded_with", {}), dict), path)
    _check_ids(reader, golden)
    return golden


def _check_ids(reader: _Reader, golden: GoldenSchedule) -> None:
    """Every request id a step names is one of the file's requests."""
    ids = [r.request_id for r in golden.requests]
    if len(set(ids)) != len(ids):
        raise reader.fail("requests", f"request ids repeat: {sorted({i for i in ids if ids.count(i) > 1})[:3]}")
    known = set(ids)
    for i, step in enumerate(golden.steps):
        named = [*step.scheduled, *step.num_computed_tokens, *(a.request_id for a in step.admitted), *step.preempted,
                 *step.new_block_ids, *step.finished, *step.added, *step.aborted]
        if unknown := [r for r in named if r not in known]:
            raise reader.fail(f"steps[{i}]", f"names request {unknown[0]!r}, which is not among the requests")
