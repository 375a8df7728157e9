"""What watching the engine live costs: ``tracevllm bench serve`` with one ``/v1/engine/events`` client
reading every event, against the same load with nobody listening, alternated back to back.

    python benchmarks/stream_cost.py --pairs 3 --duration 45 --max-concurrency 32

It starts one server (the bundled model unless ``-- --model ...``), warms it up with a short run, then
runs ``--pairs`` pairs of soaks (``bench serve --duration``: ``--max-concurrency`` clients each send
one request after another), the order within each pair alternating (without, with; with, without;
...). In the runs "with", a reader thread opens the stream before the load starts, parses every
message as JSON (as a page would) and checks that the step records arrive without a gap; with
``--page``, the live page (``/ui``) is open too, in a headless Chromium on the same machine (Selenium;
chromium and chromedriver from the system), drawing from its own stream: the issue's "page open and
stream read". ``--page bare`` opens a blank page instead, in the same browser, that reads the
stream with the page's own reader (``stream.js``) and parses every message but draws nothing: what a
browser costs before any drawing, the floor under the page's cost. It prints each run's output
throughput, the medians of both and their ratio, and what the stream carried. ``--burn F`` is the
yardstick: in the runs "with", no stream and no page, only a process that burns the fraction F of
a core in four bursts a second (as a page draws), to see what any neighbour of that size costs the
engine on this machine. Extra arguments after ``--`` go to ``serve``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from soak_serve import free_port, wait_healthy  # benchmarks/ is on sys.path when this runs as a script

from tracevllm.benchmarks.compare import machine_line


class StreamReader(threading.Thread):
    """Reads ``/v1/engine/events`` to the end: counts messages and bytes, checks the step numbers."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        self.conn.request("GET", "/v1/engine/events")
        self.sock = self.conn.sock
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.status
        self.num_messages = self.num_bytes = self.num_steps = 0
        self.gaps: list[tuple[int, int]] = []
        self.last_step: int | None = None
        self.dropped: str | None = None

    def run(self) -> None:
        try:
            while line := self.response.readline():
                if not line.startswith(b"data: "):
                    continue
                message = json.loads(line[len(b"data: "):])
                self.num_messages += 1
                self.num_bytes += len(line)
                if message["type"] == "Hello":
                    self.last_step = max(message["step"], 0)
                elif message["type"] == "StepRecord":
                    self.num_steps += 1
                    if message["step"] != self.last_step + 1:
                        self.gaps.append((self.last_step, message["step"]))
                    self.last_step = message["step"]
                elif message["type"] == "Dropped":
                    self.dropped = message["reason"]
        except OSError:
            pass  # hung up by stop()

    def stop(self) -> None:
        """Hang up: the reader sees the end of the stream (closing the connection under a reader that
        waits in readline would wait for it forever)."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.join(10)
        self.conn.close()


BARE_PAGE = """
const done = arguments[0];
window.messages = 0;
import('/ui/static/stream.js').then(({follow}) => {
  follow('/v1/engine/events', () => { window.messages++; }, () => {}, () => Promise.resolve(''));
  done();
});
"""


BURNER = """
import sys, time
busy, period = float(sys.argv[1]) * 0.25, 0.25
while True:
    started = time.perf_counter()
    while time.perf_counter() - started < busy:
        pass
    time.sleep(max(0.0, period - (time.perf_counter() - started)))
"""


def open_page(port: int, bare: bool = False):
    """The live page in a headless Chromium, once it has drawn the stream's ``Hello`` (a Selenium driver);
    ``bare``: a blank page of the same origin reading the stream with ``stream.js``, drawing nothing."""
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    chromium, driver_path = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        raise SystemExit("--page needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1600"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    if bare:
        driver.get(f"http://127.0.0.1:{port}/health")
        driver.execute_async_script(BARE_PAGE)
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return window.messages") > 0)
    else:
        driver.get(f"http://127.0.0.1:{port}/ui")
        WebDriverWait(driver, 60).until(lambda d: d.find_element("id", "status").text.startswith("connected"))
    return driver


def bench(port: int, args: argparse.Namespace, duration: float, seed: int) -> float:
    """One soak, its prompts drawn with ``seed``; its output throughput (tok/s). Each run has prompts of
    its own: with the same ones, each run found more of them in the prefix cache than the run before
    (the runs without the stream went 105, 123, 145 tok/s, one pair after another)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        subprocess.run([
            sys.executable, "-m", "tracevllm.entrypoints.cli", "bench", "serve", "--base-url",
            f"http://127.0.0.1:{port}", "--duration", str(duration), "--max-concurrency", str(args.max_concurrency),
            "--num-prompts", str(args.num_prompts), "--random-input-len", str(args.random_input_len),
            "--random-output-len", str(args.random_output_len), "--random-range-ratio", str(args.random_range_ratio),
            "--seed", str(seed), "--disable-tqdm", "--result-filename", result,
        ], check=True, stdout=subprocess.DEVNULL)
        with open(result) as f:
            return json.load(f)["output_throughput"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=45.0, help="seconds of load per run")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of load before the first run")
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=256, help="distinct prompts, cycled")
    parser.add_argument("--random-input-len", type=int, default=128)
    parser.add_argument("--random-output-len", type=int, default=64)
    parser.add_argument("--random-range-ratio", type=float, default=0.5)
    neighbours = parser.add_mutually_exclusive_group()
    neighbours.add_argument("--page", nargs="?", const="ui", choices=("ui", "bare"),
                            help="in the runs with the stream, the live page open too (bare: a page that only reads it)")
    neighbours.add_argument("--burn", type=float, metavar="F",
                            help="the runs 'with' have no stream, only a process burning F of a core (the yardstick)")
    parser.add_argument("serve_args", nargs="*", help="after --: extra flags for tracevllm serve")
    args = parser.parse_args()

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--port", str(port),
                               "--uvicorn-log-level", "warning", "--disable-log-stats", *args.serve_args])
    runs: dict[str, list[float]] = {"without": [], "with": []}
    readers: list[StreamReader] = []
    neighbour = "the burner" if args.burn is not None else "the stream"
    burner = None
    try:
        wait_healthy(port, server)
        bench(port, args, args.warmup, seed=0)
        for pair in range(args.pairs):
            for kind in ("without", "with") if pair % 2 == 0 else ("with", "without"):
                watching = kind == "with" and args.burn is None
                reader = StreamReader(port) if watching else None
                page = open_page(port, bare=args.page == "bare") if watching and args.page else None
                burner = (subprocess.Popen([sys.executable, "-c", BURNER, str(args.burn)])
                          if kind == "with" and args.burn is not None else None)
                if reader is not None:
                    reader.start()
                    readers.append(reader)
                started = time.time()
                runs[kind].append(bench(port, args, args.duration, seed=1 + sum(map(len, runs.values()))))
                if reader is not None:
                    time.sleep(1.0)  # the last steps' events
                    reader.stop()
                if page is not None:
                    page.quit()
                if burner is not None:
                    burner.kill()
                    burner.wait()
                    burner = None
                extra = (f"; stream: {reader.num_messages} messages ({reader.num_messages / (time.time() - started):.0f}/s), "
                         f"{reader.num_bytes / 2**20:.1f} MB, {reader.num_steps} steps, gaps {reader.gaps}, "
                         f"dropped: {reader.dropped}") if reader is not None else ""
                print(f"pair {pair + 1} {kind:>7} {neighbour}: {runs[kind][-1]:7.2f} output tok/s{extra}", flush=True)
    finally:
        if burner is not None:  # a run that failed
            burner.kill()
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    without, with_ = statistics.median(runs["without"]), statistics.median(runs["with"])
    watched = {"ui": "the stream and the page", "bare": "the stream and a bare page"}.get(args.page, "the stream")
    if args.burn is not None:
        watched = f"a process burning {100 * args.burn:.0f} % of a core"
    print(f"median output throughput: {without:.2f} tok/s without {watched}, {with_:.2f} with: "
          f"{100 * with_ / without:.1f} %")
    print(f"{machine_line()}; server exit code {server.returncode}")
    failed = any(r.gaps or r.dropped for r in readers)
    return 1 if failed or server.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
