"""The fill-mask core: texts holding masks in, candidates per mask out, for every door."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from service.core import check_inputs
from service.errors import label_model
from service.fillmask.model import Candidate
from service.registry import ModelRegistry
from service.settings import Settings
from service.timings import Timings

if TYPE_CHECKING:
    from service.fillmask.model import FillMaskModel


@dataclass(frozen=True)
class FillMaskQuery:
    inputs: list[str]
    model: str = ""  # empty: the default fill-mask model
    top_k: int = 0  # 0: the model's default


@dataclass(frozen=True)
class FilledMasks:
    model: str
    results: list[list[list[Candidate]]]  # input -> mask (in order) -> candidates, best first
    input_tokens: int
    timings: Timings


class FillMaskCore:
    def __init__(self, registry: ModelRegistry, settings: Settings):
        self.registry, self.settings = registry, settings

    async def fill_mask(self, query: FillMaskQuery, deadline: float | None = None) -> FilledMasks:
        """Validates (Embed's input limits; masks and top_k by the model), admits and fills; raises ServiceError."""
        start = time.perf_counter()
        # a blank text has no [MASK]: the model refuses it, naming the mask
        check_inputs(query.inputs, self.settings.embed_max_inputs, "text holding a [MASK]", blank_ok=True)
        model = cast("FillMaskModel", self.registry.get("fill-mask", query.model))
        label_model(model.name)
        r = await model.fill(query.inputs, query.top_k, deadline)
        timings = Timings.of_seconds(time.perf_counter() - start, r.tokenize_s, r.queue_s, r.inference_s)
        return FilledMasks(model.name, r.results, r.input_tokens, timings)
