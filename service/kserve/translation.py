"""Translation over the Open Inference Protocol (adapter.py): outputs `translation`
BYTES [N] and `score` FP32 [N]."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.cores import Cores
from service.grpc.translation import translate_query
from service.kserve.adapter import Produced, texts_tensor
from service.kserve.parameters import fill
from service.kserve.tensors import Tensor
from service.models import ModelInfo
from service.proto import inference_pb2 as pb

PARAMETERS = ("beam_size", "max_length", "length_penalty")


def outputs(info: ModelInfo | None) -> dict[str, tuple[str, list[int]]]:
    return {"translation": ("BYTES", [-1]), "score": ("FP32", [-1])}


async def infer(cores: Cores, model: str, texts: list[str], values: dict[str, Any], deadline: float | None) -> Produced:
    query = translate_query(fill(pb.TranslateRequest(inputs=texts, model=model), values))
    answer = await cores.translation.translate(query, deadline)
    scores = np.array([t.score for t in answer.translations], dtype=np.float32)
    return Produced(
        [texts_tensor("translation", [t.text for t in answer.translations]), Tensor("score", "FP32", scores)],
        answer.input_tokens,
        answer.output_tokens,
    )
