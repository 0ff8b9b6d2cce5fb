"""The CUDA execution provider (needs onnxruntime-gpu and a GPU; skipped cleanly otherwise)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from client import embed_request
from service.proto import inference_pb2 as pb
from service.runtime import CUDA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUDA not in ort.get_available_providers(), reason="no CUDAExecutionProvider (onnxruntime-gpu)"),
]
TEXTS = ["hello", "a longer sentence with more words in it", "short one"]


async def test_cuda_serves_the_same_embeddings(start_server, embed_models_root):
    gpu = await start_server(embed_models_root, device="cuda", strict_provider=True)
    cpu = await start_server(embed_models_root, device="cpu", variant="fp32")
    info = await gpu.models.GetModel(pb.GetModelRequest(name="tiny-embed"))
    assert info.execution_provider == CUDA and info.variant == "fp16"
    on_gpu = np.array([list(e.values) for e in (await gpu.embedding.Embed(embed_request(TEXTS))).embeddings])
    on_cpu = np.array([list(e.values) for e in (await cpu.embedding.Embed(embed_request(TEXTS))).embeddings])
    assert ((on_gpu * on_cpu).sum(axis=1)).min() > 0.999  # both normalised: cosine
