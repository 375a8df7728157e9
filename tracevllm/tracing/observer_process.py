"""``ObserverProcess``: a vLLM run's tracer (``VllmTracer``) in a process of its own, fed the recorder's
events through a pipe (optimisation ``observer_process``; off, the tracer runs in vLLM's engine core).

Why: the recorder lives in vLLM's engine core, one interpreter with vLLM's engine loop. There the
tracer builds each step's spans in the loop's thread (about 0.4 ms a step at 8 sequences on a 2-core
Xeon), and the span processor's thread encodes them to JSON, holding the GIL for about 15 ms per 512
spans, while the loop, back from its worker, waits for it: Python hands the GIL over only every 5 ms
(``sys.getswitchinterval()``). Here the loop's thread only encodes each step's events (msgspec, a
frame a step) and writes them to a pipe; a child process decodes them and hands each, in order, to the
same ``VllmTracer``, which writes the same trace. The child runs at the lowest priority (nice 19): it
takes what the model's threads leave of the cores::

    vLLM's engine core                                   python -m tracevllm.tracing.observer_process
    recorder ─▶ ObserverProcess ── a frame a step ──▶ stdin ─▶ VllmTracer.on_event ─▶ tracevllm-<pid>.jsonl
                                ◀──── one byte ──── stdout    (after an EngineIdle: every span written)

- **A frame** is a 4-byte length and a msgpack list of the events and ``LlmRequestMessage``s told
  since the last frame; one goes at each ``StepRecord``, ``EngineIdle`` and ``StartupPhase``.
- **At an ``EngineIdle``** the engine core waits for the child's byte, sent once every span so far is
  written: the trace files are complete when vLLM goes idle, as with the tracer in-process.
- **The end**: the child stops at the end of its input, having written everything: when the engine
  core closes the pipe at shutdown (``close``, which waits for it), or when the engine core dies. It
  ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process group), so the spans of the
  shutdown's aborts are still written.
- **If the child dies mid-run** (killed), vLLM keeps serving: recording stops, with an error in its log.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys

import msgspec

from tracevllm.core.events import EngineEvent, EngineIdle, StartupPhase, StepRecord
from tracevllm.tracing.vllm_tracer import LlmRequestMessage

logger = logging.getLogger(__name__)

_FRAME_AT = (StepRecord, EngineIdle, StartupPhase)  # the events after which the frame goes
_LENGTH = struct.Struct("<I")
_WRITTEN = b"."  # the child's byte: started, or every span so far written
_Message = EngineEvent | LlmRequestMessage


class ObserverProcess:
    """The engine core's side: an observer that sends what it hears to the child."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc: subprocess.Popen | None = proc
        self.pending: list[_Message] = []
        self.encoder = msgspec.msgpack.Encoder()

    @staticmethod
    def start(trace_dir: str, model: str) -> ObserverProcess:
        """Start the child and wait until its tracer is made (ValueError if it could not be)."""
        proc = subprocess.Popen([sys.executable, "-m", __name__, trace_dir, model],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if proc.stdout.read(1) != _WRITTEN:
            raise ValueError(f"tracevllm's observer process for the trace in {trace_dir!r} did not start "
                             f"(exit code {proc.wait()}; its error is above)")
        return ObserverProcess(proc)

    def on_event(self, event: _Message) -> None:
        if self.proc is None:
            return
        self.pending.append(event)
        if type(event) in _FRAME_AT:
            self._send()
            if type(event) is EngineIdle:
                self._wait_written()

    def _send(self) -> None:
        payload = self.encoder.encode(self.pending)
        self.pending = []
        try:
            self.proc.stdin.write(_LENGTH.pack(len(payload)) + payload)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):  # the child is gone (ValueError: its pipe already closed)
            self._lost()

    def _wait_written(self) -> None:
        if self.proc is not None and self.proc.stdout.read(1) != _WRITTEN:
            self._lost()

    def _lost(self) -> None:
        code = self.proc.poll()
        logger.error("tracevllm's observer process stopped mid-run (exit code %s): the trace in this run stops "
                     "here, and vLLM goes on serving", code)
        self.proc = None

    def close(self) -> None:
        """Send what is left, close the pipe and wait for the child to write everything and stop."""
        if self.proc is None:
            return
        if self.pending:
            self._send()
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None


def _read_exactly(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def main(trace_dir: str, model: str) -> None:
    """The child: hand every message to a ``VllmTracer`` until the input ends; then write everything."""
    from tracevllm.tracing.otel import flush_all_traces
    from tracevllm.tracing.vllm_tracer import VllmTracer

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(19)
    tracer = VllmTracer(trace_dir, model)
    stdin, written = sys.stdin.buffer, os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # what else prints goes to vLLM's log, not into the pipe
    written.write(_WRITTEN)
    written.flush()
    decoder = msgspec.msgpack.Decoder(list[_Message])
    while (header := _read_exactly(stdin, _LENGTH.size)) is not None:
        frame = _read_exactly(stdin, _LENGTH.unpack(header)[0])
        if frame is None:
            break
        for message in decoder.decode(frame):
            tracer.on_event(message)
            if type(message) is EngineIdle:  # the tracer has written every span so far
                try:
                    written.write(_WRITTEN)
                    written.flush()
                except BrokenPipeError:  # the engine core is gone: write what is left, and stop
                    break
    flush_all_traces()


if __name__ == "__main__":
    main(*sys.argv[1:])
