"""EngineCoreClient: how the front end reaches the EngineCore.

``make_client`` picks the transport. ``InprocClient`` calls the core directly in this process; a
later step adds ``SyncMPClient`` / ``AsyncMPClient``, which run the core in a background process
and exchange the same ``EngineCoreRequest`` / ``EngineCoreOutputs`` messages over ZMQ.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from tracevllm.config import VllmConfig
from tracevllm.engine import EngineCoreOutputs, EngineCoreRequest
from tracevllm.engine.core import EngineCore


class EngineCoreClient(ABC):
    @staticmethod
    def make_client(multiprocess_mode: bool, asyncio_mode: bool, vllm_config: VllmConfig) -> "EngineCoreClient":
        if multiprocess_mode or asyncio_mode:
            raise NotImplementedError("Only the in-process engine core exists so far (InprocClient).")
        return InprocClient(vllm_config)

    @abstractmethod
    def get_output(self) -> EngineCoreOutputs:
        """Run (or wait for) one engine step and return its outputs."""

    @abstractmethod
    def add_request(self, request: EngineCoreRequest) -> None: ...

    @abstractmethod
    def abort_requests(self, request_ids: list[str]) -> None: ...

    def shutdown(self) -> None:
        """Release the engine core (its process, for the multi-process clients)."""


class InprocClient(EngineCoreClient):
    """The engine core in the caller's process: ``get_output()`` is one ``EngineCore.step()``."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.engine_core = EngineCore(vllm_config)

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step()

    def add_request(self, request: EngineCoreRequest) -> None:
        self.engine_core.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)
