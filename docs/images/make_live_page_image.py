"""The README's screenshot of the live page: ``.venv/bin/python docs/images/make_live_page_image.py``.

It serves the bundled model with 2,000 KV blocks of 16 tokens, at most 48 requests and 512 tokens a
step, opens ``/ui`` in a headless Chromium (``apt-get install chromium chromium-driver``), sends 128
random prompts 64 at a time (``tracevllm bench serve``), and saves the page as ``live_page.png``
once the batch is full and requests wait, with the events of one running request open.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.server_utils import RemoteServer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SERVE = ["--num-gpu-blocks-override", "2000", "--block-size", "16", "--max-num-seqs", "48",
         "--max-num-batched-tokens", "512", "--max-model-len", "512"]
LOAD = ["--num-prompts", "128", "--max-concurrency", "64", "--random-input-len", "128", "--random-output-len", "96",
        "--disable-tqdm"]
WIDTH = 1400


def chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={WIDTH},1800"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def count(driver, element_id: str) -> int:
    return int(driver.execute_script(f"return document.getElementById({element_id!r}).dataset.count || 0"))


def main() -> int:
    driver = chromium()
    try:
        with RemoteServer(SERVE) as server:
            driver.get(f"http://127.0.0.1:{server.port}/ui")
            load = subprocess.Popen([sys.executable, "-m", "tracevllm.entrypoints.cli", "bench", "serve",
                                     "--base-url", f"http://127.0.0.1:{server.port}", *LOAD])
            # Wait for a full batch, a queue, and ten seconds of the charts.
            started = time.time()
            while not (count(driver, "running") >= 48 and count(driver, "waiting") >= 8
                       and time.time() - started > 10):
                if load.poll() is not None:
                    raise RuntimeError("the load ended before the batch filled up")
                time.sleep(0.2)
            driver.execute_script("document.querySelector('#running .chip').click()")
            time.sleep(1.0)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(WIDTH, height + 100)
            time.sleep(0.5)
            path = os.path.join(HERE, "live_page.png")
            driver.save_screenshot(path)
            step = driver.execute_script("return document.getElementById('step').textContent")
            print(f"wrote {path} at step {step}")
            load.wait()
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
