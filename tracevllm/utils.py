"""How tracevllm starts its processes: ``get_mp_context()`` and ``start_process()`` (vLLM's
``get_mp_context``, in ``vllm/utils``), and what every child process does: name itself
(``set_process_title``) and report why it failed (``describe_current_exception``).

The engine-core process and the worker processes start with ``fork`` where that is safe, as in
vLLM, and with ``spawn`` otherwise:

- ``fork`` copies this process, so the child imports nothing again: a script that creates an ``LLM``
  at its top level, as vLLM's examples do, works. The copy holds only the thread that forked, so
  whatever another thread was doing is lost. A CUDA context does not survive that: once CUDA is
  initialised here, the children are spawned (vLLM's rule). Nor does an OpenMP thread pool: torch's
  CPU ops run on a pool that belongs to the thread that calls them, and a child forked from that
  thread waits forever, at its first parallel region, for pool threads that were never copied. So
  ``start_process`` forks from a fresh thread, which has no pool yet. Nor does ``torch.compile``'s
  thread pool, which torch does not reset in a child: ``_forget_torch_compile_pool`` does.
- ``spawn`` starts a new interpreter, which imports the main module again (as ``__mp_main__``) before
  it runs the target. Top-level code that is not under ``if __name__ == "__main__":`` runs again
  there: it creates another engine, whose processes cannot start in a process still starting up,
  and the child dies. ``get_mp_context`` finds this out before any process starts and says how
  to fix it.

``TRACEVLLM_WORKER_MULTIPROC_METHOD=fork`` or ``spawn`` forces a method (vLLM:
``VLLM_WORKER_MULTIPROC_METHOD``).
"""

from __future__ import annotations

import ast
import logging
import multiprocessing
import os
import sys
import threading
import traceback
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

MULTIPROC_METHOD_ENV = "TRACEVLLM_WORKER_MULTIPROC_METHOD"


def get_mp_context() -> BaseContext:
    """``fork``, or ``spawn`` when CUDA is initialised in this process (or when the environment
    variable says so). Raises ``RuntimeError`` if spawning would run the main module's unguarded
    top-level code again."""
    method = os.environ.get(MULTIPROC_METHOD_ENV)
    if method is None:
        torch = sys.modules.get("torch")  # not imported: CUDA cannot be initialised (a what-if replay runs no model)
        method = "spawn" if torch is not None and torch.cuda.is_initialized() else "fork"
        reason = "CUDA is initialised in this process"
    elif method in ("fork", "spawn"):
        reason = f"{MULTIPROC_METHOD_ENV}={method}"
    else:
        raise ValueError(f"{MULTIPROC_METHOD_ENV} must be 'fork' or 'spawn', got {method!r}.")
    if method == "spawn":
        _check_main_is_guarded(reason)
    return multiprocessing.get_context(method)


def start_process(proc: BaseProcess) -> None:
    """``proc.start()``, called from a fresh thread: a forked child then has no OpenMP pool to wait
    for (see above). Exceptions are raised here. (A plain thread: a ``ThreadPoolExecutor``'s would
    be joined by the forked child itself at its exit, which fails.)"""
    failure: list[BaseException] = []

    def start() -> None:
        try:
            proc.start()
        except BaseException as e:
            failure.append(e)

    starter = threading.Thread(target=start, name=f"Start{proc.name}")
    starter.start()
    starter.join()
    if failure:
        raise failure[0]


def set_process_title(title: str) -> None:
    """So that ``ps`` and ``top`` show the process by its role (Linux; elsewhere a no-op)."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(title)
    except OSError:
        pass


def describe_current_exception() -> str:
    """The exception being handled, for the parent process to raise: ``Type: message`` (its first
    line), then the traceback."""
    exc = sys.exc_info()[1]
    headline = f"{type(exc).__name__}: {exc}".partition("\n")[0]
    return f"{headline}\n{traceback.format_exc()}"


def _forget_torch_compile_pool() -> None:
    """In a forked child: drop the parent's ``torch.compile`` thread pool (``AsyncCompile.pool``), whose
    threads were not copied, so that the child's first compile makes its own instead of waiting for
    ever on the parent's. (Torch resets its compile *process* pool itself.)"""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is not None:
        async_compile.AsyncCompile.pool.cache_clear()


os.register_at_fork(after_in_child=_forget_torch_compile_pool)


def _check_main_is_guarded(reason: str) -> None:
    """Raise if the main module's top-level statement now running (the one that is creating the
    engine) lies outside ``if __name__ == "__main__":``: a spawned child would run it again."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if path is None or frame is None:
        return  # interactive, ``python -c``, a notebook, a spawned child: nothing is run again
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    if any(_is_main_guard(node) and node.body[0].lineno <= line <= node.body[-1].end_lineno for node in tree.body):
        return
    raise RuntimeError(
        f"tracevllm must spawn its processes here ({reason}), and a spawned process imports the main "
        f"module {path} again, which would run line {line} again. Put the code that creates the engine "
        'under `if __name__ == "__main__":`.'
    )


def _is_main_guard(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__")


def configure_logging() -> None:
    """The CLI commands' log: INFO and up, to stderr, one line each with level, time and logger."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s [%(name)s] %(message)s")
