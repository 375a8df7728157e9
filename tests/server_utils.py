"""RemoteServer: a real ``tracevllm serve`` in a subprocess, for tests that talk HTTP to it."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteServer:
    """``with RemoteServer([...serve flags]) as server:`` waits until ``/health`` answers 200."""

    def __init__(self, args: list[str], api_key: str | None = None, startup_timeout: float = 300.0) -> None:
        self.port = free_port()
        self.api_key = api_key
        cmd = [sys.executable, "-m", "tracevllm.entrypoints.cli", "serve", "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.time() + startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tracevllm serve exited during start-up with code {self.proc.returncode}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise RuntimeError("tracevllm serve did not become healthy in time")
            time.sleep(0.5)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict | None = None, timeout: float = 60.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, dict):
                body = json.dumps(body)
            all_headers = {"Content-Type": "application/json"}
            if self.api_key:
                all_headers["Authorization"] = f"Bearer {self.api_key}"
            all_headers.update(headers or {})
            conn.request(method, path, body=body, headers=all_headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {sample name with labels stripped: value}, summed over label sets."""
        status, body = self.request("GET", "/metrics")
        assert status == 200
        values: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
        return values

    def engine_core_process(self) -> psutil.Process:
        return next(p for p in psutil.Process(self.proc.pid).children(recursive=True) if p.name() == "EngineCore")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "RemoteServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def assert_openai_error(status_body: tuple[int, bytes | dict], status: int, param: str | None = None,
                        contains: str = "") -> dict:
    """The response is ``status`` with OpenAI's error body, naming ``param``; returns the error."""
    got, body = status_body
    body = json.loads(body) if isinstance(body, (bytes, str)) else body
    assert got == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert error["param"] == param, error
    assert contains.lower() in error["message"].lower(), error
    return error
