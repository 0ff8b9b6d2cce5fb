"""`inference.GRPCInferenceService`, the Open Inference Protocol (KServe v2) over gRPC, on the service's port.

Health and metadata RPCs answer from the registry; ModelInfer converts the tensors and parameters
to the cores' queries (converters.py, through the v1 request message so its fields' checks apply)
and calls the same cores as the v1 doors: the same admission, validation, batching, errors
(`@grpc_errors`) and metrics (service "GRPCInferenceService"). `tritonclient.grpc` works against
it unchanged.
"""

from __future__ import annotations

import asyncio
import importlib.metadata

import grpc
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor

from service.converters import usage
from service.cores import Cores
from service.embedding import converters as embedding_converters
from service.embedding.grpc import deadline_of
from service.errors import InvalidArgument, NotFound, grpc_errors, label_model, quote
from service.generation import converters as generation_converters
from service.kserve import converters
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from service.registry import Backend
from service.translation import converters as translation_converters

SERVICE = "GRPCInferenceService"
SERVICE_NAME = oip.DESCRIPTOR.services_by_name[SERVICE].full_name  # inference.GRPCInferenceService
SERVER_NAME = "transformer-serving"


class InferenceServicer(oip_grpc.GRPCInferenceServiceServicer):
    def __init__(self, cores: Cores, max_generations: int):
        self.cores, self.registry = cores, cores.registry
        self.max_generations = max_generations  # settings gen_max_queue: one call never holds more places

    @grpc_errors(SERVICE)
    async def ServerLive(self, request, context: grpc.aio.ServicerContext) -> oip.ServerLiveResponse:
        return oip.ServerLiveResponse(live=True)

    @grpc_errors(SERVICE)
    async def ServerReady(self, request, context: grpc.aio.ServicerContext) -> oip.ServerReadyResponse:
        return oip.ServerReadyResponse(ready=not self.registry.draining)

    @grpc_errors(SERVICE)
    async def ModelReady(self, request, context: grpc.aio.ServicerContext) -> oip.ModelReadyResponse:
        try:
            label_model(self._model(request.name, request.version).name)
        except NotFound:
            return oip.ModelReadyResponse(ready=False)
        return oip.ModelReadyResponse(ready=not self.registry.draining)

    @grpc_errors(SERVICE)
    async def ServerMetadata(self, request, context: grpc.aio.ServicerContext) -> oip.ServerMetadataResponse:
        return oip.ServerMetadataResponse(name=SERVER_NAME, version=_version())

    @grpc_errors(SERVICE)
    async def ModelMetadata(self, request, context: grpc.aio.ServicerContext) -> oip.ModelMetadataResponse:
        self.registry.admit()
        model = self._model(request.name, request.version)
        label_model(model.name)
        return converters.model_metadata(model.name, model.kind, int(model.manifest.embedding_dim or 0))

    @grpc_errors(SERVICE)
    async def ModelInfer(self, request: oip.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> oip.ModelInferResponse:
        self.registry.admit()
        model = self._model(request.model_name, request.model_version)
        label_model(model.name)
        texts = converters.input_texts(request)
        wanted = converters.requested_outputs(request, model.kind)
        values = converters.parameters(request, model.kind)
        run = {"embedding": self._embed, "generation": self._generate, "translation": self._translate}[model.kind]
        outputs, counts = await run(model, texts, values, context)
        return converters.infer_response(request, model.name, outputs, wanted, counts)

    def _model(self, name: str, version: str) -> Backend:
        if not name:
            raise InvalidArgument("model name is empty; ServerMetadata and ModelMetadata name the served models")
        model = self.registry.find(name)
        if model.kind not in converters.TENSORS:  # fill-mask: its own RPC, no OIP tensors defined
            raise NotFound(f"model {quote(name)} is a {model.kind} model, which this protocol does not serve; "
                           "call inference.v1.FillMaskService/FillMask")
        if version not in ("", converters.VERSION):
            raise NotFound(f"model {quote(name)} has no version {quote(version)}; its only version is "
                           f"{converters.VERSION!r} (or leave it empty)")
        return model

    async def _embed(self, model: Backend, texts: list[str], values: dict, context) -> tuple:
        query = embedding_converters.embed_query(converters.embed_request(texts, model.name, values))
        answer = await self.cores.embedding.embed(query, deadline_of(context))
        return converters.embedding_outputs(answer.vectors), usage(answer.input_tokens)

    async def _generate(self, model: Backend, texts: list[str], values: dict, context) -> tuple:
        """One generation per text, decoded together by the model's scheduler; all or none."""
        if len(texts) > self.max_generations:
            raise InvalidArgument(f"{len(texts)} texts in one call; a generation model queues at most "
                                  f"{self.max_generations}: split the call")
        deadline, generations = deadline_of(context), []
        try:
            for text in texts:
                query = generation_converters.generate_query(converters.generate_request(text, model.name, values))
                generations.append(await self.cores.generation.generate(query, deadline))
            results = await asyncio.gather(*(g.collect() for g in generations))
        finally:
            for generation in generations:  # frees the rows of every sequence when one fails or the call ends
                generation.cancel()
        done = [generation_converters.generate_response(chunks, model.name) for chunks in results]
        counts = usage(sum(r.usage.input_tokens for r in done), sum(r.usage.output_tokens for r in done))
        return [converters.text_output("text_output", [r.text for r in done])], counts

    async def _translate(self, model: Backend, texts: list[str], values: dict, context) -> tuple:
        request = converters.translate_request(texts, model.name, values)
        answer = await self.cores.translation.translate(translation_converters.translate_query(request),
                                                        deadline_of(context))
        outputs = [converters.text_output("translation", [t.text for t in answer.translations]),
                   converters.scores_output([t.score for t in answer.translations])]
        return outputs, usage(answer.input_tokens, answer.output_tokens)


def _version() -> str:
    try:
        return importlib.metadata.version(SERVER_NAME)
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def register(server: grpc.aio.Server, cores: Cores) -> None:
    """Registers GRPCInferenceService on server."""
    servicer = InferenceServicer(cores, cores.settings.gen_max_queue)
    oip_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


def reflection_pool(*files: FileDescriptor) -> descriptor_pool.DescriptorPool:
    """One pool holding `files` and what they import, for server reflection: the OIP file lives in a
    pool of its own (service/protogen.py), which reflection over the default pool would not see."""
    pool = descriptor_pool.DescriptorPool()

    def add(file: FileDescriptor) -> None:
        try:
            pool.FindFileByName(file.name)
        except KeyError:
            for dependency in file.dependencies:
                add(dependency)
            pool.AddSerializedFile(file.serialized_pb)

    for file in files:
        add(file)
    return pool
