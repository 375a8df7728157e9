"""Optimisation "cpu_paged_decode": decode attention read in place from the paged KV cache, on CPU.

The plain torch backend gathers every decode row's keys and values out of the cache blocks into a
padded copy and runs SDPA on the copy (``TorchAttentionImpl._decode``): at long contexts it reads
the context three times (gather in, gather out, SDPA) and runs SDPA's flash kernel on queries of
one row. ``cpu_paged_decode.cpp`` reads each row's K/V once, through its block table, where it lies,
as vLLM's CPU backend and every GPU paged-attention kernel do. It is the one C++ file in tracevllm:
no Python route measured (Inductor, flex_attention, numba; docs/perf.md) read the cache in place
faster than gather + SDPA.

The op is built once per machine and torch version, the first time a CPU engine loads a model with
the switch on, by ``torch.utils.cpp_extension`` (a C++ compiler and ``ninja`` are needed; about 6 s
on 2 cores), and cached in ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``). The
build uses the vector width torch itself picked for this CPU (AVX-512, AVX2 or none) through ATen's
``Vectorized<float>``, and ``at::parallel_for`` on torch's own OpenMP threads.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_suffix(".cpp")
# Compiler flags per torch CPU capability: the ones torch builds its own kernels of that level with.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "DEFAULT": [],
}
_loaded: bool | None = None  # None: not tried yet in this process


def load() -> bool:
    """Build (once per machine) and load the op; False, with a warning, where it cannot be built."""
    global _loaded
    if _loaded is None:
        capability = torch.backends.cpu.get_cpu_capability()
        if capability not in _CAPABILITY_FLAGS:  # e.g. AVX512_BF16 on newer torch: its AVX-512 base is enough
            capability = "AVX512" if capability.startswith("AVX512") else "DEFAULT"
        flags = ["-O3", "-fopenmp", f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}",
                 *_CAPABILITY_FLAGS[capability]]
        try:
            from torch.utils import cpp_extension

            cpp_extension.load(name=f"tracevllm_cpu_paged_decode_{capability.lower()}", sources=[str(_SOURCE)],
                               extra_cflags=flags, extra_ldflags=["-fopenmp"], is_python_module=False)
            _loaded = True
        except Exception as e:  # no compiler, no ninja, a failed build: the plain path still works
            logger.warning("cpu_paged_decode: could not build the C++ op (%s); decode attention on CPU runs "
                           "the plain gather + SDPA path instead.", e)
            _loaded = False
    return _loaded


def supports(head_dim: int) -> bool:
    """Whether the op handles this head size: it is compiled for powers of two from 16 to 256."""
    return head_dim in (16, 32, 64, 128, 256)


def paged_decode_attention(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                           rows: torch.Tensor, tokens: torch.Tensor, scale: float, sliding_window: int | None) -> None:
    """``out[tokens[i]]`` = attention of ``query[tokens[i]]`` (one decode token) over the keys of
    request ``rows[i]``: positions ``0 .. seq_lens[rows[i]] - 1`` (the last ``sliding_window`` of
    them, with a window), read in place from ``key_cache``/``value_cache`` through ``block_table``.

    Shapes as ``AttentionImpl.forward``'s: query and out ``[num_tokens, num_heads, head_dim]``, the
    caches ``[num_blocks, block_size, num_kv_heads, head_dim]``, ``block_table`` and ``seq_lens``
    int32; ``rows`` and ``tokens`` int64. Softmax and sums in float32, whatever the cache dtype."""
    torch.ops.tracevllm.paged_decode_attention(out, query, key_cache, value_cache, block_table, seq_lens,
                                               rows, tokens, scale, sliding_window or 0)
