"""Building tracevllm's C++ CPU ops on first use.

Each ``.cpp`` file beside this one (and ``layers/cpu_norm_act.cpp``) is its own extension (with the
``.h`` files it includes), built
once per machine and torch version by ``torch.utils.cpp_extension`` (a C++ compiler and ``ninja`` are
needed; build times in docs/perf-log.md) and cached in ``$TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``), under a name that changes with the source (``extension_name``). A build
uses the vector width torch itself picked for this CPU (AVX-512, AVX2 or none) through ATen's
``Vectorized<float>``, and ``at::parallel_for`` on torch's own OpenMP threads. Each file registers
its op under ``torch.ops.tracevllm``.

A build holds a ``lock`` file in its build directory, and another process that wants the op waits
for it to go. A build killed half-way (Ctrl-C at the first start) leaves it behind, and torch would
then wait forever: a lock older than ``STALE_LOCK_S`` (a build takes seconds) is removed, with a
warning, before loading.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from pathlib import Path

import torch

from tracevllm.worker import one_time_costs

logger = logging.getLogger(__name__)

# Compiler flags per torch CPU capability: the ones torch builds its own kernels of that level with.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "DEFAULT": [],
}
_loaded: dict[str, bool] = {}  # per op file: whether it built and loaded in this process
STALE_LOCK_S = 300.0
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def load(name: str, extra_cflags: tuple[str, ...] = (), source: Path | None = None,
         fallback: str = "attention on CPU runs the next choice instead (attention/backends/cpu_attn.py, "
                         "choose_cpu_attention_ops)") -> bool:
    """Build (once per machine) and load ``source`` (default: ``<name>.cpp`` beside this file), with
    ``extra_cflags`` beyond the CPU capability's; False, with a warning that says what runs instead
    (``fallback``), where it cannot be built."""
    if name not in _loaded:
        capability = torch.backends.cpu.get_cpu_capability()
        if capability not in _CAPABILITY_FLAGS:  # e.g. AVX512_BF16 on newer torch: its AVX-512 base is enough
            capability = "AVX512" if capability.startswith("AVX512") else "DEFAULT"
        flags = ["-O3", "-fopenmp", f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}",
                 *_CAPABILITY_FLAGS[capability], *extra_cflags]
        try:
            from torch.utils import cpp_extension

            start_time, start = time.time(), time.perf_counter()
            source = source or Path(__file__).with_name(f"{name}.cpp")
            extension = extension_name(name, capability, source, flags)
            build_directory = Path(cpp_extension._get_build_directory(extension, verbose=False))
            _remove_stale_lock(build_directory / "lock")
            library = build_directory / f"{extension}.so"
            before = library.stat().st_mtime_ns if library.exists() else None
            logger.info("C++ op %s: building it (once per machine, 6-10 s) or loading it from torch's cache...", name)
            cpp_extension.load(name=extension, sources=[str(source)], extra_cflags=flags,
                               extra_ldflags=["-fopenmp"], is_python_module=False)
            seconds = time.perf_counter() - start
            cached = before is not None and library.stat().st_mtime_ns == before  # ninja found nothing to build
            logger.info("C++ op %s: %s in %.1f s", name, "loaded from the cache" if cached else "built", seconds)
            one_time_costs.record(f"C++ op {name}", start_time, seconds, cached)
            _loaded[name] = True
        except Exception as e:  # no compiler, no ninja, a failed build: the plain path still works
            logger.warning("%s: could not build the C++ op (%s); %s.", name, e, fallback)
            _loaded[name] = False
    return _loaded[name]


def extension_name(name: str, capability: str, source: Path, flags: list[str]) -> str:
    """The op's name in torch's build cache, one build directory each: a digest of the source (with
    the headers it includes), where it lies, the flags and torch's version. Two checkouts of tracevllm on
    one machine, or an old commit beside a new one, each keep their own build instead of rebuilding
    over each other's at every start (torch's build files name the source's path)."""
    digest = hashlib.sha256(str(source.resolve()).encode())
    for path in (source, *included_headers(source)):
        digest.update(path.read_bytes())
    digest.update(" ".join([*flags, torch.__version__]).encode())
    return f"tracevllm_{name}_{capability.lower()}_{digest.hexdigest()[:12]}"


def included_headers(source: Path) -> list[Path]:
    """The headers ``source`` includes by a quoted path (``#include "../../layers/x.h"``, relative to
    the file that includes it), and the ones those include: a header shared by ops in two folders."""
    found: list[Path] = []
    pending = [source]
    while pending:
        including = pending.pop()
        for name in _QUOTED_INCLUDE.findall(including.read_text()):
            header = (including.parent / name).resolve()
            if header.exists() and header not in found:
                found.append(header)
                pending.append(header)
    return found


def _remove_stale_lock(lock: Path) -> None:
    """Remove a build's lock file left by a build that did not finish (the module docstring says why)."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_S:
        logger.warning("%s is %.0f s old: a build of this C++ op was stopped before it finished; removing the "
                       "lock and building again.", lock, age)
        lock.unlink(missing_ok=True)
