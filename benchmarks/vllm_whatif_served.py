"""Does ``tracevllm traces whatif`` hold on a served vLLM? One recorded ``vllm serve`` run, predictions from
its trace, and real vLLM re-runs of each.

    python benchmarks/vllm_whatif_served.py --vllm-python .venv-vllm/bin/python --out /tmp/vws

Every run is a ``vllm serve`` of the bundled model of its own with ``tracevllm.vllm.TracingScheduler``
(its trace in ``TRACEVLLM_TRACE_DIR``), fed by ``vllm bench serve``: random prompts of 128 tokens to 64
(``--ignore-eos``), Poisson arrivals at ``--rate``, the same ``--seed`` in every run, so every run sends
the same prompts, and a run at twice the rate the same arrivals at half the gaps. The server stops with
SIGTERM and ``--shutdown-timeout``, which completes its trace. Per change: the prediction from the
recorded run's trace (``traces whatif``, with ``--arrival-scale`` for a rate changed), and two real runs;
the row puts the prediction's error against the first real run beside the second real run's (the
machine's own noise), as ``whatif_matrix.py --served`` does for tracevllm's server. Rows are scored as
that script scores them (``whatif_fidelity.compare``: requests matched by arrival rank).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_neighbour import SERVED_NAME, VLLM_CLI  # noqa: E402
from soak_serve import wait_healthy  # noqa: E402
from whatif_fidelity import HEADER, _line, _settings, compare  # noqa: E402

from tracevllm.benchmarks.compare import machine_line  # noqa: E402
from tracevllm.models.loader import resolve_model  # noqa: E402
from tracevllm.whatif.command import whatif  # noqa: E402

BASE = {"max_num_batched_tokens": 256, "max_num_seqs": 32}
CHANGES = {  # what the recorded run's trace predicts, each also run for real: (settings, arrival scale)
    "none (the recorded configuration)": ({}, 1.0),
    "arrivals x2 (--arrival-scale 2)": ({}, 2.0),
    "token budget 256 -> 64": ({"max_num_batched_tokens": 64}, 1.0),
    "max_num_seqs 32 -> 8": ({"max_num_seqs": 8}, 1.0),
}


def run(args: argparse.Namespace, model_dir: str, settings: dict, rate: float, trace_dir: str) -> None:
    """One served vLLM run, recorded into ``trace_dir``."""
    env = {**os.environ, "TRACEVLLM_TRACE_DIR": trace_dir, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in {**BASE, **settings}.items()]
    with open(f"{trace_dir}.log", "w") as log:  # the server's own log, beside its trace
        server = subprocess.Popen(
            [args.vllm_python, "-m", "tracevllm.vllm", "serve", model_dir, "--port", str(args.port),
             "--dtype", args.dtype, "--served-model-name", SERVED_NAME, "--scheduler-cls",
             "tracevllm.vllm.TracingScheduler", "--no-async-scheduling", "--enforce-eager", "--shutdown-timeout", "60",
             *flags],
            env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        wait_healthy(args.port, server)
        subprocess.run(
            [args.vllm_python, "-c", VLLM_CLI, "bench", "serve", "--backend", "openai",
             "--base-url", f"http://127.0.0.1:{args.port}", "--model", SERVED_NAME, "--tokenizer", model_dir,
             "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "64", "--ignore-eos",
             "--num-prompts", str(args.num_prompts), "--request-rate", str(rate), "--seed", "0", "--disable-tqdm"],
            capture_output=True, text=True, check=True)
    finally:
        server.send_signal(15)
        server.wait(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=os.environ.get("TRACEVLLM_VLLM_PYTHON", ".venv-vllm/bin/python"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rate", type=float, default=2.0, help="the recorded run's requests a second")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--port", type=int, default=8050)
    parser.add_argument("--out", default=None, help="where the traces go (default: a temporary directory)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="vllm_whatif_served_")
    os.makedirs(out, exist_ok=True)
    model_dir = str(resolve_model(None))
    print(machine_line())
    print(f"traces in {out}", flush=True)
    recorded = os.path.join(out, "recorded")
    run(args, model_dir, {}, args.rate, recorded)
    print(HEADER, flush=True)
    verdicts = []
    for change, (settings, scale) in CHANGES.items():
        slug = "".join(c if c.isalnum() else "-" for c in change.split(" (")[0]).strip("-")
        reals = [os.path.join(out, f"{slug}-real{i}") for i in (1, 2)]
        for real in reals:
            run(args, model_dir, settings, args.rate * scale, real)
        predicted = os.path.join(out, f"{slug}-predicted")
        start = time.perf_counter()
        whatif(recorded, _settings(settings), predicted, arrival_scale=scale)
        seconds = time.perf_counter() - start
        row = compare("vLLM served", change, reals[0], predicted, seconds)
        noise = compare("vLLM served", change + ": second real run", reals[0], reals[1], float("nan"))
        print(_line(row) + "\n" + _line(noise), flush=True)
        margin = 100 * (row.e2e_error_median - noise.e2e_error_median)
        verdicts.append(f"{change}: e2e median {100 * row.e2e_error_median:.1f} % against "
                        f"{100 * noise.e2e_error_median:.1f} % real-vs-real ({margin:+.1f} points)")
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
