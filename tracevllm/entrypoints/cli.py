"""The ``tracevllm`` command: ``serve``, ``generate``, ``bench throughput|serve|kernels``, ``traces push|jaeger``,
``viz``."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from tracevllm.attention.selector import BACKEND_NAMES
from tracevllm.config import EngineArgs


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's engine flags; every option defaults to EngineArgs' default."""
    d = EngineArgs()
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="HF directory, .gguf file, or 'smollm2' (the bundled default)")
    g.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--max-model-len", type=int, default=d.max_model_len)
    g.add_argument("--block-size", type=int, default=d.block_size)
    g.add_argument("--num-gpu-blocks-override", dest="num_gpu_blocks", type=int, default=d.num_gpu_blocks)
    g.add_argument("--kv-cache-memory-bytes", type=int, default=d.kv_cache_memory_bytes)
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching)
    g.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    g.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    g.add_argument("--scheduling-policy", default=d.scheduling_policy, choices=["fcfs", "priority"])
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--device", default=d.device)
    g.add_argument("--attention-backend", default=d.attention_backend, choices=BACKEND_NAMES,
                   help="auto: triton on CUDA, torch on CPU (triton on CPU needs TRITON_INTERPRET=1)")
    g.add_argument("--trace-out", default=d.trace_out, help="directory for OTLP JSON Lines trace files")
    g.add_argument("--otlp-traces-endpoint", default=d.otlp_traces_endpoint,
                   help="export spans live over OTLP (e.g. Jaeger's http://127.0.0.1:4317); the protocol is "
                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: grpc (default) or http/protobuf")
    g.add_argument("--trace-level", default=d.trace_level, choices=["request", "step"],
                   help="step (default): also one trace per engine step; request: only the requests' traces")
    g.add_argument("--trace-include-text", action="store_true", default=d.trace_include_text,
                   help="put the prompt and completion text on llm_request spans (token counts are always there)")
    g.add_argument("--tensor-parallel-size", type=int, default=d.tensor_parallel_size)


def engine_args_from(args: argparse.Namespace) -> EngineArgs:
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    return EngineArgs(**{k: v for k, v in vars(args).items() if k in names})


def _generate(args: argparse.Namespace) -> int:
    from tracevllm import LLM, SamplingParams

    llm = LLM(**dataclasses.asdict(engine_args_from(args)))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.sampling_seed,
    )
    if args.chat:
        outputs = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)
    else:
        outputs = llm.generate(args.prompt, params, use_tqdm=False)
    print(outputs[0].outputs[0].text)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tracevllm.entrypoints.openai.api_server import main as serve_main

    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"Two models given: {args.model_tag!r} and --model {args.model!r}.")
        args.model = args.model_tag
    return serve_main(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tracevllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="the OpenAI-compatible HTTP server")
    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="as --model")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", nargs="+", default=None,
                       help="the name(s) clients use in the model field (default: the model as given)")
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer <key>' on /v1 routes")
    serve.add_argument("--disable-log-stats", action="store_true",
                       help="no periodic stats log line and no Prometheus metrics")
    serve.add_argument("--uvicorn-log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug", "trace"])
    add_engine_args(serve)
    serve.set_defaults(func=_serve)

    gen = sub.add_parser("generate", help="complete one prompt and print the text")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    add_engine_args(gen)
    gen.set_defaults(func=_generate)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    from tracevllm.benchmarks.throughput import add_cli_args, run_throughput

    tp = bench.add_parser("throughput", help="offline throughput on a random dataset (like vllm bench throughput)")
    add_cli_args(tp)
    add_engine_args(tp)
    tp.set_defaults(func=run_throughput)

    from tracevllm.benchmarks.serve import add_cli_args as add_serve_args, run_serve_benchmark

    bs = bench.add_parser("serve", help="online serving against a running server (like vllm bench serve)")
    add_serve_args(bs)
    bs.set_defaults(func=run_serve_benchmark)

    from tracevllm.benchmarks.viz import add_cli_args as add_viz_bench_args, run_viz_benchmark

    bv = bench.add_parser("viz", help="time viz on a large trace directory (recorded first unless given)")
    add_viz_bench_args(bv)
    add_engine_args(bv)
    bv.set_defaults(func=run_viz_benchmark)

    from tracevllm.benchmarks.kernels import add_cli_args as add_kernel_args, run_kernels

    kernels = bench.add_parser("kernels", help="the Triton paged-attention kernel vs SDPA on gathered K/V")
    add_kernel_args(kernels)
    kernels.set_defaults(func=run_kernels)

    from tracevllm.tracing.replay import add_cli_args as add_traces_args

    add_traces_args(sub)

    from viz.cli import add_cli_args as add_viz_args, run as run_viz

    viz_parser = sub.add_parser("viz", help="draw a --trace-out directory: pictures, report.html, Perfetto JSON")
    add_viz_args(viz_parser)
    viz_parser.set_defaults(func=run_viz)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
