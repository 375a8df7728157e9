"""The README's screenshot of the live page: ``.venv/bin/python docs/images/make_live_page_image.py``.

It serves the bundled model with 2,000 KV blocks of 16 tokens, at most 48 requests and 512 tokens a
step, opens ``/ui`` in a headless Chromium (``apt-get install chromium chromium-driver``), sends 128
random prompts of 128 tokens, 48 out, 64 at a time (``tracevllm bench serve``), and saves the page
as ``live_page.png`` once the batch is full, requests wait and eight have finished, with the events of
one running request open.

``--replay`` records the same run with ``--trace-out`` and takes the picture from ``tracevllm traces
view`` instead, the recorded run replayed at its own pace.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.server_utils import RemoteServer, free_port  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SERVE = ["--num-gpu-blocks-override", "2000", "--block-size", "16", "--max-num-seqs", "48",
         "--max-num-batched-tokens", "512", "--max-model-len", "512"]
LOAD = ["--num-prompts", "128", "--max-concurrency", "64", "--random-input-len", "128", "--random-output-len", "48",
        "--disable-tqdm"]
WIDTH = 1400
CLI = [sys.executable, "-m", "tracevllm.entrypoints.cli"]


def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={WIDTH},1800"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def finished(driver) -> int:
    return int(driver.execute_script("return document.getElementById('requests-summary').dataset.finished || 0"))


def count(driver, element_id: str) -> int:
    return int(driver.execute_script(f"return document.getElementById({element_id!r}).dataset.count || 0"))


def screenshot_when_busy(driver, still_running) -> str:
    """Wait for a full batch, a queue and eight requests finished; open a running request's events;
    save the whole page."""
    started = time.time()
    while not (count(driver, "running") >= 48 and count(driver, "waiting") >= 8 and finished(driver) >= 8):
        if not still_running() or time.time() - started > 600:
            raise RuntimeError("the run ended (or took ten minutes) before the batch filled up")
        time.sleep(0.2)
    driver.execute_script("document.querySelector('#running .chip').click()")
    time.sleep(1.0)
    driver.set_window_size(WIDTH, driver.execute_script("return document.documentElement.scrollHeight") + 100)
    time.sleep(0.5)
    path = os.path.join(HERE, "live_page.png")
    driver.save_screenshot(path)
    step = driver.execute_script("return document.getElementById('step').textContent")
    print(f"wrote {path} at step {step}")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay", action="store_true", help="record the run, then picture its replay")
    args = parser.parse_args()
    driver = chromium()
    try:
        with tempfile.TemporaryDirectory() as trace_dir:
            with RemoteServer(SERVE + (["--trace-out", trace_dir] if args.replay else [])) as server:
                url = f"http://127.0.0.1:{server.port}"
                if not args.replay:
                    driver.get(f"{url}/ui")
                load = subprocess.Popen([*CLI, "bench", "serve", "--base-url", url, *LOAD])
                if not args.replay:
                    screenshot_when_busy(driver, lambda: load.poll() is None)
                load.wait()
            if args.replay:
                port = free_port()
                view = subprocess.Popen([*CLI, "traces", "view", trace_dir, "--port", str(port)])
                try:
                    while not healthy(port):  # the trace is loaded and told again as events first
                        time.sleep(0.5)
                    driver.get(f"http://127.0.0.1:{port}/ui")
                    screenshot_when_busy(driver, lambda: view.poll() is None)
                finally:
                    view.terminate()
                    view.wait()
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
