"""Drain on a real SIGTERM, at every door: `python -m service` over every tiny model kind.

Calls in flight (a gRPC and an HTTP Translate of many sources, decoded one at a time) finish after
the signal; meanwhile health says NOT_SERVING (gRPC Watch, HTTP /health, KServe readiness), and new
calls of every kind, by gRPC, HTTP and KServe and on new connections, get UNAVAILABLE (HTTP 503)
from the service, not a closed port; then the process exits 0.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time

import grpc
import httpx2 as httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.http as triton_http
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from service.proto import open_inference_grpc_pb2 as oip
from service.proto import open_inference_grpc_pb2_grpc as oip_grpc
from tests.fixtures.process import ServiceProcess

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SOURCES = [f"How are you today, my friend number {i}?" for i in range(96)]
NEW_GRPC_CALLS = {  # one call of every kind, as a client that connects during the drain sends it
    "Embed": lambda ch: pb_grpc.EmbeddingServiceStub(ch).Embed(pb.EmbedRequest(inputs=["a new call"]), timeout=10),
    "Generate": lambda ch: pb_grpc.GenerationServiceStub(ch).Generate(pb.GenerateRequest(prompt="Hi"), timeout=10),
    "Translate": lambda ch: pb_grpc.TranslationServiceStub(ch).Translate(
        pb.TranslateRequest(inputs=["Hi"]), timeout=10
    ),
    "FillMask": lambda ch: pb_grpc.FillMaskServiceStub(ch).FillMask(
        pb.FillMaskRequest(inputs=["a [MASK]"]), timeout=10
    ),
    "Attention": lambda ch: pb_grpc.InspectionServiceStub(ch).Attention(
        pb.AttentionRequest(model="tiny-embed", text="a b"), timeout=10
    ),
    "Chat": lambda ch: pb_grpc.GenerationServiceStub(ch).Chat(
        pb.ChatRequest(messages=[pb.ChatMessage(role="user", content="Hi")]), timeout=10
    ),
    "ListModels": lambda ch: pb_grpc.ModelServiceStub(ch).ListModels(pb.ListModelsRequest(), timeout=10),
    "ModelInfer": lambda ch: oip_grpc.GRPCInferenceServiceStub(ch).ModelInfer(_infer_request(), timeout=10),
}
NEW_HTTP_CALLS = {
    "/v1/embeddings": {"input": ["a new call"]},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    "/v1/translate": {"inputs": ["Hi"]},
    "/v1/fill-mask": {"inputs": ["a [MASK]"]},
}


def _infer_request() -> oip.ModelInferRequest:
    request = oip.ModelInferRequest(model_name="tiny-embed")
    text = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"a new call")
    return request


def queued_sources(service: ServiceProcess) -> float:
    return service.metrics().get(("ts_queue_depth", (("model", "tiny-translate"),)), 0.0)


@pytest.mark.slow
def test_sigterm_drains_every_door_and_exits_0(tiny_models_root):
    service = ServiceProcess(
        tiny_models_root, "--grace-seconds", "60", "--compute-workers", "1", "--translate-max-batch", "1"
    )
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        channel = grpc.insecure_channel(service.address)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
        assert next(watch).status == SERVING
        in_flight_grpc = pb_grpc.TranslationServiceStub(channel).Translate.future(
            pb.TranslateRequest(inputs=SOURCES, beam_size=1), timeout=120
        )
        with httpx.Client(base_url=service.http_url, timeout=120) as http:
            in_flight_http = pool.submit(http.post, "/v1/translate", json={"inputs": SOURCES, "beam_size": 1})
            while queued_sources(service) < len(SOURCES) * 3 / 2:  # both calls wait in the queue
                assert not in_flight_grpc.done() and not in_flight_http.done()
                time.sleep(0.01)

            service.proc.send_signal(signal.SIGTERM)
            assert next(watch).status == NOT_SERVING
            watch.cancel()
            with grpc.insecure_channel(service.address, options=[("grpc.use_local_subchannel_pool", 1)]) as fresh:
                for name, new_call in NEW_GRPC_CALLS.items():
                    with pytest.raises(grpc.RpcError) as err:
                        new_call(fresh)
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, name
                    assert "shutting down" in err.value.details(), (name, err.value.details())
            kserve = triton.InferenceServerClient(service.address)  # KServe's own client
            assert kserve.is_server_live()
            assert not kserve.is_server_ready() and not kserve.is_model_ready("tiny-embed")
            text = triton.InferInput("text", [1], "BYTES")
            text.set_data_from_numpy(np.array([b"a new call"], dtype=np.object_))
            with pytest.raises(InferenceServerException) as caught:
                kserve.infer("tiny-embed", [text])
            assert caught.value.status() == "StatusCode.UNAVAILABLE" and "shutting down" in caught.value.message()
            kserve.close()
            rest = triton_http.InferenceServerClient(service.http_url.removeprefix("http://"))  # the REST binding
            assert rest.is_server_live()
            assert not rest.is_server_ready() and not rest.is_model_ready("tiny-embed")
            rest_text = triton_http.InferInput("text", [1], "BYTES")
            rest_text.set_data_from_numpy(np.array([b"a new call"], dtype=np.object_))
            with pytest.raises(InferenceServerException) as caught:
                rest.infer("tiny-embed", [rest_text])
            assert caught.value.status() == "503" and "shutting down" in caught.value.message()
            rest.close()
            with httpx.Client(base_url=service.http_url, timeout=10) as fresh_http:  # a new connection
                health = fresh_http.get("/health")
                assert health.status_code == 503 and health.json() == {"status": "NOT_SERVING"}
                for route, body in NEW_HTTP_CALLS.items():
                    reply = fresh_http.post(route, json=body)
                    assert reply.status_code == 503, (route, reply.text)
                    assert reply.json()["error"]["code"] == "UNAVAILABLE" and "shutting down" in reply.text, route
            assert not in_flight_grpc.done() or not in_flight_http.done(), "the in-flight calls ended too soon"

            translated = in_flight_grpc.result()
            assert len(translated.translations) == len(SOURCES)
            reply = in_flight_http.result()
            assert reply.status_code == 200 and len(reply.json()["translations"]) == len(SOURCES)
        channel.close()
        assert service.wait() == 0, "".join(service.log)
        assert service.find(r"\bstopped\b"), "".join(service.log)
    finally:
        pool.shutdown(cancel_futures=True)
        service.kill()
