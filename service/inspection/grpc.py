"""InspectionService: validate, convert, delegate to the model's `AttentionInspector`, convert back.

One inspector per served model, made on its first call (its graph session opens then). An empty
`model` means the default embedding model; any served model may be named. At most
`MAX_IN_FLIGHT` calls compute at once: more get RESOURCE_EXHAUSTED at once, before any work
(a call holds whole-sequence maps of every layer, far more memory than an embedding).
"""

from __future__ import annotations

import time

import grpc

from service.errors import ResourceExhausted, grpc_errors, label_model
from service.inspection import converters
from service.inspection.attention import AttentionInspector
from service.manifest import ModelDir
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.registry import ModelRegistry
from service.runtime import Runtime
from service.settings import Settings

MAX_IN_FLIGHT = 4


class InspectionServicer(pb_grpc.InspectionServiceServicer):
    def __init__(self, registry: ModelRegistry, settings: Settings, runtime: Runtime):
        self.registry, self.settings, self.runtime = registry, settings, runtime
        self._inspectors: dict[str, AttentionInspector] = {}
        self._in_flight = 0

    @grpc_errors("InspectionService")
    async def Attention(self, request: pb.AttentionRequest, context: grpc.aio.ServicerContext) -> pb.AttentionResponse:
        self.registry.admit()
        start = time.perf_counter()
        backend = self.registry.find(request.model) if request.model else self.registry.get("embedding")
        label_model(backend.name)
        inspector = self._inspector(backend)
        query = converters.attention_query(request)
        inspector.check(query)
        if self._in_flight >= MAX_IN_FLIGHT:
            raise ResourceExhausted(f"{MAX_IN_FLIGHT} attention calls are already computing; retry shortly")
        self._in_flight += 1
        try:
            result = await inspector.inspect(query)
        finally:
            self._in_flight -= 1
        return converters.attention_response(result, backend.name, backend.kind, time.perf_counter() - start)

    def _inspector(self, backend) -> AttentionInspector:
        if backend.name not in self._inspectors:
            model_dir = ModelDir(self.registry.dirs[backend.name], backend.manifest)
            self._inspectors[backend.name] = AttentionInspector(backend, model_dir, self.runtime,
                                                                self.settings.max_message_bytes)
        return self._inspectors[backend.name]
