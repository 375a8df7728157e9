"""Where the live page's CPU goes under load: the browser's own counters and every process's CPU.

    python benchmarks/page_profile.py [--seconds 20] [--cpuprofile FILE] [--css 'canvas {...}']

It starts ``tracevllm serve`` on the bundled model, loads it with ``tracevllm bench serve`` (32 clients,
as ``benchmarks/stream_cost.py`` does), opens ``/ui`` in a headless Chromium (Selenium; chromium and
chromedriver from the system) and, over ``--seconds``, reads:

- Chromium's ``Performance.getMetrics`` (DevTools protocol): the renderer's main thread busy
  (``TaskDuration``), and of that JavaScript, layout and style, in seconds a second;
- the CPU each process used, in % of a core: the engine core, the API server, the load's client,
  Chromium's browser, renderer and GPU processes;
- with ``--cpuprofile``, the page's JavaScript profile (``Profiler``), its heaviest functions printed
  and the profile written (Chromium's DevTools opens it).

``--css`` adds a style sheet to the page first, to try a rule without editing it.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time

import psutil
from soak_serve import free_port, wait_healthy  # benchmarks/ is on sys.path when this runs as a script
from stream_cost import open_page

METRICS = ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")


def cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far, by the kind of process."""
    used: dict[str, float] = collections.Counter()
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            args = p.info["cmdline"] or []
            line = " ".join(args)
            if "chrom" in p.info["name"] or "chrom" in line:
                kind = "chromium " + next((a.split("=", 1)[1] for a in args if a.startswith("--type=")), "browser")
            elif p.info["name"] == "EngineCore":
                kind = "engine core"
            elif "bench" in args and "serve" in args:
                kind = "load (bench serve)"
            elif "serve" in args:
                kind = "API server"
            else:
                continue
            times = p.cpu_times()
            used[kind] += times.user + times.system
        except psutil.Error:
            pass
    return used


def heaviest(profile: dict, n: int = 15) -> list[tuple[float, str]]:
    """The ``n`` functions with the most self time in a DevTools CPU profile (ms, name)."""
    nodes = {node["id"]: node["callFrame"] for node in profile["nodes"]}
    self_ms: dict[str, float] = collections.Counter()
    for sample, delta in zip(profile["samples"], [*profile["timeDeltas"][1:], 0]):
        frame = nodes[sample]
        where = f"{frame['url'].rsplit('/', 1)[-1]}:{frame['lineNumber'] + 1}" if frame["url"] else ""
        self_ms[f"{frame['functionName'] or '(anonymous)'} {where}".strip()] += delta / 1000
    return sorted(((ms, name) for name, ms in self_ms.items()), reverse=True)[:n]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--cpuprofile", metavar="FILE")
    parser.add_argument("--css", help="a style sheet added to the page before measuring")
    args = parser.parse_args()

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--port", str(port),
                               "--uvicorn-log-level", "warning", "--disable-log-stats"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver = None
    try:
        wait_healthy(port, server)
        load = subprocess.Popen([
            sys.executable, "-m", "tracevllm.entrypoints.cli", "bench", "serve", "--base-url",
            f"http://127.0.0.1:{port}", "--duration", str(args.seconds + 40), "--max-concurrency", "32",
            "--num-prompts", "256", "--random-input-len", "128", "--random-output-len", "64",
            "--random-range-ratio", "0.5", "--disable-tqdm"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(8)  # the load under way
        driver = open_page(port)
        if args.css:
            driver.execute_script("const s = document.createElement('style'); s.textContent = arguments[0]; "
                                  "document.head.appendChild(s);", args.css)
        driver.execute_cdp_cmd("Performance.enable", {})
        time.sleep(5)

        def metrics() -> dict[str, float]:
            return {m["name"]: m["value"] for m in driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}

        before, cpu_before, started = metrics(), cpu_seconds(), time.time()
        if args.cpuprofile:
            driver.execute_cdp_cmd("Profiler.enable", {})
            driver.execute_cdp_cmd("Profiler.start", {})
        time.sleep(args.seconds)
        profile = driver.execute_cdp_cmd("Profiler.stop", {})["profile"] if args.cpuprofile else None
        after, cpu_after, elapsed = metrics(), cpu_seconds(), time.time() - started
        print(f"over {elapsed:.1f} s at 32 clients:")
        for name in METRICS:
            print(f"  page {name}: {(after[name] - before[name]) / elapsed:.3f} s a second")
        for kind in sorted(cpu_after):
            print(f"  {kind}: {100 * (cpu_after[kind] - cpu_before.get(kind, 0)) / elapsed:.1f} % of a core")
        if profile is not None:
            with open(args.cpuprofile, "w") as f:
                json.dump(profile, f)
            print(f"JavaScript profile in {args.cpuprofile}; most self time:")
            for ms, name in heaviest(profile):
                print(f"  {ms:8.1f} ms  {name}")
        load.terminate()
        load.wait(30)
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
