"""Engine options are declared once, in EngineArgs: the CLI's flags and LLM()'s keywords come from it.

No model is loaded here: these tests are fast.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import pathlib
import re
import typing

import pytest
import torch

import tracevllm
from tracevllm import LLM
from tracevllm.config import (
    BlockSize, DistributedExecutorBackend, ModelDType, SchedulerPolicy, TraceLevel, UsageContext, VllmConfig,
)
from tracevllm.engine.arg_utils import (
    TARGET_STEP_SECONDS, EngineArgs, default_max_num_batched_tokens, default_max_num_seqs,
)
from tracevllm.entrypoints.cli import make_parser
from tracevllm.optimizations import DISABLE_ENV, OptimizationConfig

FIELDS = [f.name for f in dataclasses.fields(EngineArgs)]
# Every field away from its default, so that each one's flag is exercised.
CHANGED = EngineArgs(
    model="some/model", served_model_name=["a", "b"], dtype="float16", max_model_len=128, block_size=8,
    num_gpu_blocks_override=10, kv_cache_memory_bytes=1 << 20, enable_prefix_caching=False, max_num_seqs=3,
    max_num_batched_tokens=512, enable_chunked_prefill=False, long_prefill_token_threshold=64, scheduling_policy="priority",
    scheduler_reserve_full_isl=False, watermark=0.25, async_scheduling=True,
    tensor_parallel_size=2, pipeline_parallel_size=2,
    distributed_executor_backend="ray", enforce_eager=True, gpu_memory_utilization=0.5, seed=7, device="cpu", cpu_threads=3, attention_backend="torch",
    disable_optimizations=["rope_cache", "decode_plan"], trace_out="traces",
    otlp_traces_endpoint="http://127.0.0.1:4317", trace_level="request", trace_include_text=True,
    otlp_metrics_endpoint="http://127.0.0.1:4318",
)
COMMANDS = {"serve": ["serve"], "generate": ["generate", "Hello"], "bench throughput": ["bench", "throughput"],
            "bench viz": ["bench", "viz"]}


def engine_argv(engine_args: EngineArgs) -> list[str]:
    """The flags that give ``engine_args``, found through the actions add_cli_args makes."""
    actions = {a.dest: a for a in EngineArgs.add_cli_args(argparse.ArgumentParser())._actions}
    argv: list[str] = []
    for name in FIELDS:
        action, value = actions[name], getattr(engine_args, name)
        flag = next(s for s in action.option_strings if s.startswith("--"))  # --x (not -x, and not --no-x)
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif isinstance(value, list):
            argv += [flag, *value]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def test_changed_moves_every_field():
    default = EngineArgs()
    assert [n for n in FIELDS if getattr(CHANGED, n) == getattr(default, n)] == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_engine_flag_round_trips(command):
    parser = make_parser()
    argv = COMMANDS[command]
    assert EngineArgs.from_cli_args(parser.parse_args(argv)) == EngineArgs()  # CLI defaults = dataclass defaults
    assert EngineArgs.from_cli_args(parser.parse_args([*argv, *engine_argv(CHANGED)])) == CHANGED


def test_vllm_flag_spellings():
    args = make_parser().parse_args([
        "serve", "--num-gpu-blocks-override", "5", "-tp", "1", "--no-enable-prefix-caching",
        "--no-enable-chunked-prefill", "--trace-include-text", "--max-model-len", "64", "--served-model-name", "x",
    ])
    engine_args = EngineArgs.from_cli_args(args)
    assert (engine_args.num_gpu_blocks_override, engine_args.tensor_parallel_size, engine_args.max_model_len) == (5, 1, 64)
    assert not engine_args.enable_prefix_caching and not engine_args.enable_chunked_prefill
    assert engine_args.trace_include_text and engine_args.served_model_name == ["x"]
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "--dtype", "float64"])  # choices are checked


def test_help_shows_the_engine_flags_with_defaults(capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for flag, default in [("--max-num-seqs", "as vLLM's, 256; on CPU 256 offline and 128 for the server, times "
                                             "tensor_parallel_size x pipeline_parallel_size"), ("--block-size", "16"), ("--dtype", "auto"),
                          ("--trace-level", "step"), ("--enable-prefix-caching", "True")]:
        assert flag in help_text
        assert f"(default: {default})" in help_text
    assert "90 % of the free GPU memory" in help_text
    for field in dataclasses.fields(EngineArgs):
        assert field.metadata["help"], f"{field.name} has no help"


def test_default_token_budget_keeps_a_cpu_step_short():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_max_num_batched_tokens(cpu, UsageContext.LLM_CLASS, 1) == 4096
    assert default_max_num_batched_tokens(cpu, UsageContext.OPENAI_API_SERVER, 1) == 2048
    assert default_max_num_batched_tokens(cpu, UsageContext.OPENAI_API_SERVER, 4) == 8192
    assert default_max_num_batched_tokens(cuda, UsageContext.LLM_CLASS, 2) == 8192
    assert default_max_num_batched_tokens(cuda, UsageContext.OPENAI_API_SERVER, 1) == 8192
    assert default_max_num_seqs(cpu, UsageContext.LLM_CLASS, 1) == 256
    assert default_max_num_seqs(cpu, UsageContext.OPENAI_API_SERVER, 2) == 256
    assert default_max_num_seqs(cuda, UsageContext.OPENAI_API_SERVER, 1) == 256


def test_the_help_states_the_default_token_budget_the_engine_uses():
    """--max-num-batched-tokens' help says what create_engine_config and the engine core do: its
    figures are default_max_num_batched_tokens' and TARGET_STEP_SECONDS, and the server's is fitted
    (test_default_token_budget_in_the_engine_config), not a fixed 2048."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    help_text = " ".join(EngineArgs.add_cli_args(argparse.ArgumentParser()).format_help().split())
    said = re.search(r"--max-num-batched-tokens MAX_NUM_BATCHED_TOKENS .*?\(default: (\d+) on CUDA; on CPU (\d+) "
                     r"offline, and for the server fitted at start-up to what this CPU runs in ([\d.]+) s a step, "
                     r"timed on dummy prefills, between max_num_seqs and a ceiling of (\d+), and logged as "
                     r"'Token budget: max_num_batched_tokens=N'; on CPU times tensor_parallel_size x "
                     r"pipeline_parallel_size;", help_text)
    assert said, help_text
    assert [int(n) for n in said.group(1, 2, 4)] == [
        default_max_num_batched_tokens(cuda, UsageContext.OPENAI_API_SERVER, 1),
        default_max_num_batched_tokens(cpu, UsageContext.LLM_CLASS, 1),
        default_max_num_batched_tokens(cpu, UsageContext.OPENAI_API_SERVER, 1)]
    assert float(said.group(3)) == TARGET_STEP_SECONDS


def test_default_token_budget_in_the_engine_config(tiny_checkpoint):
    args = EngineArgs(model=tiny_checkpoint("llama"), device="cpu")
    assert args.create_engine_config().scheduler_config.max_num_batched_tokens == 4096
    assert args.create_engine_config().scheduler_config.target_step_seconds is None  # offline: throughput
    server = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
    assert server.scheduler_config.max_num_batched_tokens == 2048  # the ceiling the engine core fits under
    assert server.scheduler_config.target_step_seconds == TARGET_STEP_SECONDS
    assert server.scheduler_config.max_num_seqs == 128
    many_seqs = dataclasses.replace(args, max_num_seqs=5000).create_engine_config()
    assert many_seqs.scheduler_config.max_num_batched_tokens == 5000  # at least max_num_seqs
    chosen = dataclasses.replace(args, max_num_batched_tokens=300).create_engine_config(UsageContext.OPENAI_API_SERVER)
    assert chosen.scheduler_config.max_num_batched_tokens == 300
    assert chosen.scheduler_config.target_step_seconds is None  # the user's budget is kept as given


def test_choices_come_from_the_configs_literals():
    actions = {a.dest: a for a in EngineArgs.add_cli_args(argparse.ArgumentParser())._actions}
    for name, literal in [("dtype", ModelDType), ("block_size", BlockSize), ("scheduling_policy", SchedulerPolicy),
                          ("distributed_executor_backend", DistributedExecutorBackend), ("trace_level", TraceLevel)]:
        assert tuple(actions[name].choices) == typing.get_args(literal), name
    assert actions["block_size"].type is int
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "--scheduling-policy", "lifo"])


@pytest.mark.parametrize("options, match", [
    (dict(max_model_len=4096), r"max_model_len must be <= the model's max_position_embeddings \(1024\), got 4096"),
    (dict(max_model_len=0), "max_model_len must be >= 1, got 0"),
    (dict(block_size=3), "block_size must be one of"),
    (dict(num_gpu_blocks_override=0), "num_gpu_blocks_override must be >= 1"),
    (dict(max_num_seqs=0), "max_num_seqs must be >= 1"),
    (dict(max_num_seqs=8, max_num_batched_tokens=4), r"max_num_batched_tokens must be >= max_num_seqs \(8\)"),
    (dict(enable_chunked_prefill=False, max_num_seqs=8, max_num_batched_tokens=64), "With chunked prefill off"),
    (dict(scheduling_policy="lifo"), "scheduling_policy must be one of"),
    (dict(trace_level="span"), "trace_level must be one of"),
    (dict(cpu_threads=0), "cpu_threads must be >= 1, got 0"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be >= 1, got 0"),
    (dict(device="tpu"), "device must be 'auto', 'cpu' or 'cuda"),
])
def test_bad_values_are_value_errors_from_the_configs(tiny_checkpoint, options, match):
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=tiny_checkpoint("llama"), **{"device": "cpu", **options}).create_engine_config()


def test_the_environment_is_read_by_create_engine_config_only(tiny_checkpoint, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "rope_cache")
    args = EngineArgs(model=tiny_checkpoint("llama"), device="cpu")
    config = args.create_engine_config()
    assert config.optimization_config.disabled == {"rope_cache"}
    chosen = dataclasses.replace(args, disable_optimizations=[]).create_engine_config()
    assert chosen.optimization_config == OptimizationConfig()  # an explicit list wins
    parts = {f.name: getattr(config, f.name) for f in dataclasses.fields(VllmConfig) if f.name != "optimization_config"}
    assert VllmConfig(**parts).optimization_config == OptimizationConfig()  # the default reads no environment


def test_unknown_llm_option_is_a_clear_error_before_loading():
    with pytest.raises(ValueError, match=r"unknown engine option 'max_num_seq'; did you mean 'max_num_seqs'\?"):
        LLM(max_num_seq=4)
    with pytest.raises(ValueError, match=r"LLM\(\) got an unknown engine option 'unknown_option'") as info:
        LLM(unknown_option=1)
    assert "EngineArgs' fields (tracevllm/engine/arg_utils.py)" in str(info.value)
    with pytest.raises(ValueError, match=r"did you mean 'multiprocess'\?"):
        LLM(multiproces=True)


def test_from_cli_args_takes_only_its_fields():
    args = argparse.Namespace(max_num_seqs=4, port=8000, prompt="hi")
    assert EngineArgs.from_cli_args(args) == EngineArgs(max_num_seqs=4)


def test_benchmarks_and_server_do_not_import_the_cli():
    root = pathlib.Path(tracevllm.__file__).parent
    offenders = []
    for path in [*(root / "benchmarks").rglob("*.py"), *(root / "entrypoints" / "openai").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            if any(n == "tracevllm.entrypoints.cli" or n.startswith("tracevllm.entrypoints.cli.") for n in names):
                offenders.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert offenders == []
