"""What the Open Inference Protocol costs the server beside the service's own Embed (docs/design/kserve.md).

One real `python -m service` over `--models`; alternating rounds of `--calls` sequential calls
embedding the same `--texts` sentences: `inference.v1.EmbeddingService/Embed` (packed vectors,
the cheaper v1 encoding), `inference.GRPCInferenceService/ModelInfer` through tritonclient.grpc
(raw tensors), and the REST binding through tritonclient.http with binary tensors (its default)
and with JSON tensors. Server CPU (user + system, /proc) and wall-clock per call, each side's
ratio to Embed per round, and whether all returned the same vectors.

    python -m bench.oip_overhead --models models --calls 200 --rounds 3
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as triton
import tritonclient.http as triton_http

from bench.common import ServiceProcess, conditions, emit, summary
from bench.procstat import cpu_seconds
from client import array
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc


def sentences(n: int) -> list[str]:
    return [
        f"sentence {i}: the weather was fine, so the cat and the dog took a long walk in the park" for i in range(n)
    ]


def timed(pid: int, call, calls: int) -> tuple[float, float]:
    """(server CPU ms, wall ms) per call over `calls` sequential calls."""
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    for _ in range(calls):
        call()
    return (cpu_seconds(pid) - cpu0) * 1e3 / calls, (time.perf_counter() - t0) * 1e3 / calls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=Path, default=Path("models"))
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    before = conditions()
    server = ServiceProcess(args.models, [])
    try:
        texts = sentences(args.texts)
        stub = pb_grpc.EmbeddingServiceStub(grpc.insecure_channel(server.address))
        request = pb.EmbedRequest(inputs=texts, model=args.model, encoding=pb.EMBEDDING_ENCODING_PACKED_FLOAT32)
        client = triton.InferenceServerClient(server.address)
        tensor = triton.InferInput("text", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        rest = triton_http.InferenceServerClient(server.http_url.removeprefix("http://"))
        binary, json_text = (triton_http.InferInput("text", [len(texts)], "BYTES") for _ in range(2))
        binary.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        json_text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=False)
        as_json = [triton_http.InferRequestedOutput("embedding", binary_data=False)]
        sides = {
            "v1_embed_packed": lambda: stub.Embed(request),
            "oip_model_infer": lambda: client.infer(args.model, [tensor]),
            "oip_rest_binary": lambda: rest.infer(args.model, [binary]),
            "oip_rest_json": lambda: rest.infer(args.model, [json_text], outputs=as_json),
        }
        reference = array(stub.Embed(request))
        same = all(np.array_equal(reference, sides[s]().as_numpy("embedding")) for s in list(sides)[1:])
        for call in sides.values():  # warm-up
            timed(server.proc.pid, call, 20)
        figures: dict[str, dict[str, list[float]]] = {s: {"cpu_ms": [], "wall_ms": []} for s in sides}
        ratios: dict[str, list[float]] = {s: [] for s in list(sides)[1:]}
        for _ in range(args.rounds):
            for side, call in sides.items():
                cpu, wall = timed(server.proc.pid, call, args.calls)
                figures[side]["cpu_ms"].append(cpu)
                figures[side]["wall_ms"].append(wall)
            for side in ratios:
                ratios[side].append(figures[side]["cpu_ms"][-1] / figures["v1_embed_packed"]["cpu_ms"][-1])
    finally:
        server.stop()
    emit(
        {
            "model": args.model,
            "texts_per_call": args.texts,
            "calls_per_round": args.calls,
            "same_vectors": same,
            **{side: {k: summary(v) for k, v in f.items()} for side, f in figures.items()},
            **{f"server_cpu_ratio_{side}_over_v1": summary(r, 3) for side, r in ratios.items()},
            "conditions": [before, conditions()],
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
