"""TokenizerLanes: the server's tokenizer threads, one lane for huge inputs and one for the rest.

    run_tokenizer(size, fn)  ──▶  size > LARGE_INPUT_SIZE ?  ──yes──▶  large lane (1 thread), then malloc_trim
                                                           ──no───▶  small lane (3 threads)
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

SMALL_INPUT_THREADS = 3
LARGE_INPUT_THREADS = 1
LARGE_INPUT_SIZE = 64 * 1024  # characters (or token ids): about 16k tokens of English text
T = TypeVar("T")
_malloc_trim = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim", None)  # glibc only


class TokenizerLanes:
    """The threads that run the server's tokenizer calls (encode, decode, chat template), in two lanes.

    The event loop streams every client's tokens and answers ``/health``, and a prompt of megabytes
    keeps the tokenizer busy for seconds. Threads are enough because the Hugging Face fast tokenizer
    lets go of the GIL while its Rust code encodes (its ``encode`` goes through
    ``Tokenizer.encode_batch``; a direct ``Tokenizer.encode`` keeps the GIL, and so, less long, does
    ``decode``). Several threads may call the tokenizer at once because nothing ever reconfigures it
    (truncation, padding): they only read it.

    Why two lanes: with one pool of four threads, four concurrent prompts of megabytes held all four
    and every other request waited behind them. An input of more than ``LARGE_INPUT_SIZE``
    characters (or token ids) goes to the large lane (one thread), any other to the small lane
    (three threads), which large inputs never enter: a huge input waits only behind other huge
    inputs. A thread still takes a core: on a 2-core machine the engine core's forward pass (two
    OpenMP threads) slows down while a huge prompt is encoded. The figures:
    docs/perf-log.md#source-figures.
    """

    def __init__(self) -> None:
        self.small = ThreadPoolExecutor(max_workers=SMALL_INPUT_THREADS, thread_name_prefix="tokenizer")
        self.large = ThreadPoolExecutor(max_workers=LARGE_INPUT_THREADS, thread_name_prefix="tokenizer-large")

    def submit(self, size: int, call: Callable[[], T]) -> Future[T]:
        """``call()`` in the lane for an input of ``size`` characters or token ids."""
        if size > LARGE_INPUT_SIZE:
            return self.large.submit(_then_return_freed_memory, call)
        return self.small.submit(call)


def _then_return_freed_memory(call: Callable[[], T]) -> T:
    """``call()``, then glibc's ``malloc_trim(0)``: the tokenizer's memory for a huge input goes back to
    the system. glibc keeps what is freed in its heaps (one per thread) for the next ``malloc``, so
    without the trim the API server holds on to a huge input's memory for good; a lower mmap threshold
    does not help, the tokenizer's allocations being small ones (docs/perf-log.md#tokenizer-malloc-trim).
    A trim takes milliseconds; an input of this lane, seconds."""
    try:
        return call()
    finally:
        if _malloc_trim is not None:
            _malloc_trim(0)
