"""Rerankers and classifiers over the Open Inference Protocol (service/kserve/adapter.py).

The `text` input's texts are classified: output `scores` FP32 [N, L] (every label's score, in the
model's label order: ModelMetadata gives L) and `label` BYTES [N] (each text's best label; empty with `query`). With the
parameter `query` (a one-label model: a reranker) the texts are the documents, each scored against
the query: `scores` [N, 1] in input order, not sorted. Parameters `raw_scores` and `truncate` as the
inference.v1 requests have them; the v1 converters and the core check them as for every door.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.cores import Cores
from service.grpc.classification import classify_query, rerank_query
from service.kserve.adapter import Produced
from service.kserve.parameters import fill
from service.kserve.tensors import Tensor
from service.models import ModelInfo
from service.proto import inference_pb2 as pb

PARAMETERS = ("query", "raw_scores", "truncate")


def outputs(info: ModelInfo | None) -> dict[str, tuple[str, list[int]]]:
    labels = len(info.manifest.get("labels", "").split(",")) if info else -1
    return {"scores": ("FP32", [-1, labels]), "label": ("BYTES", [-1])}


async def infer(cores: Cores, model: str, texts: list[str], values: dict[str, Any], deadline: float | None) -> Produced:
    values = dict(values)
    query = values.pop("query", None)
    best = np.full(len(texts), b"", dtype=object)  # (N,)
    if query is not None:
        request = fill(pb.RerankRequest(documents=texts, model=model), {"query": query, **values})
        ranked = await cores.classification.rerank(rerank_query(request), deadline)
        scores = np.zeros((len(texts), 1), dtype=np.float32)  # (N, 1), in input order
        scores[ranked.indexes, 0] = ranked.scores
        tokens = ranked.input_tokens
    else:
        inputs = [pb.ClassifyInput(text=t) for t in texts]
        request = fill(pb.ClassifyRequest(inputs=inputs, model=model), values)
        answer = await cores.classification.classify(classify_query(request), deadline)
        scores, tokens = answer.scores.astype(np.float32), answer.input_tokens  # (N, L)
        best[:] = [answer.labels[i].encode() for i in scores.argmax(axis=1).tolist()]
    return Produced([Tensor("scores", "FP32", scores), Tensor("label", "BYTES", best)], tokens, 0)
