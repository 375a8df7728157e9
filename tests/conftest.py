"""Shared fixtures: the bundled model (converted once per cache directory) and tiny checkpoints."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run on the CPU through Triton's interpreter, which reads this variable when
    # triton is first imported (so before any test module imports it).
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def cpu_threads_that_fit():
    """The tests' own torch work (the transformers references, the kernels' plain-torch checks) runs in
    this process, so it picks its threads the way an engine does (worker/cpu_threads.py): on a machine
    where another process keeps a core busy, two threads would make every multi-row GEMM wait."""
    from tracevllm.worker.cpu_threads import choose_cpu_threads, usable_cores

    choose_cpu_threads(None, usable_cores())


@pytest.fixture(scope="module", autouse=True)
def release_cuda_memory():
    """On CUDA, hand a module's engines' memory back to the device when the module ends: a KV cache
    takes 90 % of the free memory, so the next module's engine (or CLI subprocess) would find none."""
    yield
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


# The tests' own tmp_path directories, whose traces are checked as each test ends (or, marked
# broken_traces, never): the session's last check looks only at the other trace directories.
_TEST_DIRS: set[Path] = set()


@pytest.fixture(autouse=True)
def recorded_traces_hold_the_engine_invariants(request):
    """Every trace a test records into its ``tmp_path`` passes ``tracevllm traces check``
    (viz/check.py) once the test is over: the engine's invariants hold in every run the suite makes."""
    from tests.trace_utils import assert_traces_hold_the_invariants

    tmp_path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp_path is not None:
        _TEST_DIRS.add(tmp_path)
        if request.node.get_closest_marker("broken_traces") is None:
            assert_traces_hold_the_invariants(tmp_path)


@pytest.fixture(scope="session", autouse=True)
def session_traces_hold_the_engine_invariants(tmp_path_factory):
    """The same check, once the session is over, on the traces of fixtures that outlive a test
    (``tmp_path_factory.mktemp``): their engines and servers have stopped, their files are whole."""
    from tests.trace_utils import assert_traces_hold_the_invariants

    yield
    assert_traces_hold_the_invariants(tmp_path_factory.getbasetemp(), skip=_TEST_DIRS)


@pytest.fixture(scope="session")
def bundled_model_dir() -> str:
    """The bundled SmolLM2-135M-Instruct as a Hugging Face directory (converted on first use)."""
    from tracevllm.models.loader import bundled_gguf_path, resolve_model

    try:
        bundled_gguf_path()
    except ValueError as e:
        pytest.skip(f"the bundled model is not installed: {e}")
    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, bundled_model_dir):
    """``tiny_checkpoint(arch, **config_overrides)`` -> a directory with a tiny random-weight
    checkpoint (see tests/tiny_checkpoints.py), built once per session for each distinct call."""
    from tests.tiny_checkpoints import make_tiny_checkpoint

    built: dict[str, str] = {}

    def build(arch: str, **overrides) -> str:
        key = f"{arch}{sorted(overrides.items())}"
        if key not in built:
            built[key] = make_tiny_checkpoint(arch, tmp_path_factory.mktemp(arch), bundled_model_dir, **overrides)
        return built[key]

    return build


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium driven by Selenium (the browser from the system's packages: apt-get install
    chromium chromium-driver, which .ci/run does); its console is kept for ``get_log("browser")``."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.skip("no chromium / chromedriver (apt-get install chromium chromium-driver; .ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1600"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()
