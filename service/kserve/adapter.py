"""What a kind brings to the Open Inference Protocol: its module here, `service/kserve/<kind>.py`, gives
its request parameters, its output tensors and one inference over its core (the `Adapter` protocol).
The data plane (dataplane.py) reaches them through its table `ADAPTERS` and names no kind otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from service.kserve.tensors import Tensor

if TYPE_CHECKING:
    from service.cores import Cores
    from service.models import ModelInfo


@dataclass(frozen=True)
class Produced:
    outputs: list[Tensor]  # every output the kind returns
    input_tokens: int
    output_tokens: int


class Adapter(Protocol):
    @property
    def PARAMETERS(self) -> tuple[str, ...]:
        """Parameters a request may set: field names of the kind's inference.v1 request."""
        ...

    def outputs(self, info: ModelInfo | None) -> dict[str, tuple[str, list[int]]]:
        """output -> (datatype, shape), -1 for any size, as ModelMetadata describes them for the model
        `info` (None: any model of the kind, for the names alone)."""
        ...

    async def infer(
        self, cores: Cores, model: str, texts: list[str], values: dict[str, Any], deadline: float | None
    ) -> Produced:
        """The `text` input's texts through the kind's core, with the checked parameters."""
        ...


def texts_tensor(name: str, texts: list[str]) -> Tensor:
    """UTF-8 texts as a BYTES [N] tensor."""
    array = np.empty(len(texts), dtype=object)
    array[:] = [t.encode() for t in texts]
    return Tensor(name, "BYTES", array)
