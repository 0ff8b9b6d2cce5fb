"""The HTTP door's cost beside gRPC: wall-clock and server CPU per Embed call, one process, same models.

One real `python -m service` answers both doors. Per round, each way of calling runs `--calls`
sequential calls on one kept-alive connection, and the server's CPU (user + system, /proc) is
read around them; ways alternate within a round, so each ratio compares calls made under the
same load. Ways: gRPC with float values and with packed float32; HTTP JSON with
`encoding_format` float and base64 (httpx, the client the openai SDK uses); the openai SDK
itself (base64 by default, decoded by the SDK). Sizes: 1 sentence and 32 sentences per call.

    python -m bench.http_overhead --models models --rounds 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import grpc
import httpx2 as httpx
from openai import OpenAI

from bench.common import ServiceProcess, conditions, emit, summary
from bench.procstat import cpu_seconds
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc

SIZES = {1: 100, 32: 20}  # inputs per call -> calls per way and round


def ways(server: ServiceProcess) -> dict:
    stub = pb_grpc.EmbeddingServiceStub(grpc.insecure_channel(server.address))
    http = httpx.Client(base_url=server.http_url, timeout=60)
    sdk = OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    packed = pb.EMBEDDING_ENCODING_PACKED_FLOAT32
    return {
        "grpc_float": lambda texts: stub.Embed(pb.EmbedRequest(inputs=texts)),
        "grpc_packed": lambda texts: stub.Embed(pb.EmbedRequest(inputs=texts, encoding=packed)),
        "http_float": lambda texts: http.post(
            "/v1/embeddings", json={"input": texts, "encoding_format": "float"}
        ).raise_for_status(),
        "http_base64": lambda texts: http.post(
            "/v1/embeddings", json={"input": texts, "encoding_format": "base64"}
        ).raise_for_status(),
        "openai_sdk": lambda texts: sdk.embeddings.create(model="", input=texts),
    }


def measure(server: ServiceProcess, rounds: int) -> dict:
    calls = ways(server)
    out: dict = {}
    for size, n in SIZES.items():
        texts = [f"Sentence {i} says something about serving one model over two protocols." for i in range(size)]
        for fn in calls.values():  # warm every path (connections, first batches)
            for _ in range(5):
                fn(texts)
        wall: dict = {name: [] for name in calls}
        cpu: dict = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                c0, t0 = cpu_seconds(server.proc.pid), time.perf_counter()
                for _ in range(n):
                    fn(texts)
                wall[name].append((time.perf_counter() - t0) / n * 1e3)
                cpu[name].append((cpu_seconds(server.proc.pid) - c0) / n * 1e3)
        out[f"{size}_inputs"] = {
            name: {"wall_ms_per_call": summary(wall[name]), "server_cpu_ms_per_call": summary(cpu[name])}
            for name in calls
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("models"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    before = conditions()
    server = ServiceProcess(args.models, [])
    try:
        result = measure(server, args.rounds)
    finally:
        server.stop()
    emit({"bench": "http_overhead", "conditions_before": before, "conditions_after": conditions(), **result})


if __name__ == "__main__":
    main()
