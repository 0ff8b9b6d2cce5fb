"""The translation core: sentences and search options in, translations with scores out, for every door."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from service.core import check_inputs
from service.errors import label_model
from service.registry import ModelRegistry
from service.settings import Settings
from service.timings import Timings
from service.translation.model import TranslateOptions, Translation

if TYPE_CHECKING:
    from service.translation.model import TranslationModel


@dataclass(frozen=True)
class TranslateQuery:
    inputs: list[str]
    options: TranslateOptions
    model: str = ""  # empty: the default translation model


@dataclass(frozen=True)
class Translations:
    model: str
    translations: list[Translation]  # in input order
    input_tokens: int
    output_tokens: int
    timings: Timings


class TranslationCore:
    def __init__(self, registry: ModelRegistry, settings: Settings):
        self.registry, self.settings = registry, settings

    async def translate(self, query: TranslateQuery, deadline: float | None = None) -> Translations:
        """Validates, admits (queue places per source, before tokenizing) and translates; raises ServiceError."""
        start = time.perf_counter()
        check_inputs(query.inputs, self.settings.translate_max_inputs, "sentence to translate", blank_ok=False)
        model = cast("TranslationModel", self.registry.get("translation", query.model))
        label_model(model.name)
        r = await model.translate(query.inputs, query.options, deadline)
        r.timings.total_ms = (time.perf_counter() - start) * 1e3
        return Translations(model.name, r.translations, r.input_tokens, r.output_tokens, r.timings)
