"""`FillMaskModel`: the registry backend for kind "fill-mask" (tokenizer + engine + the embedding batcher).

`fill()` takes plain Python values and returns a `FillResult`, on the same path as Embed and with
the same limits (settings `embed_*`): take queue places first (`batcher.admission`),
tokenize (never truncating: a cut could drop a `[MASK]`; too long is INVALID_ARGUMENT), check
every input's masks, queue through the batcher (the engine keeps each mask's best candidates),
then slice `top_k` and write each candidate's `sequence`: the input with that mask filled, decoded
as Hugging Face's fill-mask pipeline does (`skip_special_tokens` with one mask; with several the
other masks stay `[MASK]`, and [CLS]/[SEP]/padding are left out, which the pipeline keeps).
Limits per call: `top_k` <= MAX_TOP_K (and the vocabulary), masks per input <= MAX_MASKS,
masks x top_k summed over the inputs <= MAX_CANDIDATES (bounds the response).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from service import tokenizing
from service.embedding.model import admit_and_encode, queue_limits
from service.engine.batcher import Batcher, BatchLimits
from service.engine.layout import encoder_engine
from service.engine.packing import alignment
from service.engine.tokenization import EmbeddingTokenizer, Encoded
from service.errors import InvalidArgument
from service.fillmask.engine import FillMaskEngine, MaskRows, PackedFillMaskEngine
from service.manifest import Manifest, ModelDir
from service.registry import model_info
from service.runtime import Runtime
from service.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_TOP_K = 5  # top_k 0 (Hugging Face's pipeline default too)
MAX_TOP_K = 100
MAX_MASKS = 16  # per input
MAX_CANDIDATES = 4096  # masks x top_k, summed over a call's inputs
INLINE_DECODES = 256  # calls up to this many candidates are decoded on the event loop
TOO_LONG = "shorten it (fill-mask never truncates: a cut could drop a mask)"


@dataclass(frozen=True)
class Candidate:
    token: str
    token_id: int
    score: float
    sequence: str


@dataclass(frozen=True)
class FillResult:
    results: list[list[list[Candidate]]]  # input -> mask (in order) -> candidates, best first
    input_tokens: int
    tokenize_s: float
    queue_s: float
    inference_s: float


class FillMaskModel:
    kind = "fill-mask"

    def __init__(
        self,
        manifest: Manifest,
        tokenizer: EmbeddingTokenizer,
        decoder: Tokenizer,
        engine: FillMaskEngine | PackedFillMaskEngine,
        runtime: Runtime,
        limits: BatchLimits,
        variant: str,
    ):
        self.name, self.manifest, self.variant = manifest.name, manifest, variant
        self.tokenizer, self.decoder, self.engine, self.runtime = tokenizer, decoder, engine, runtime
        self.provider = engine.provider
        self.mask_id = int(manifest.special_tokens["mask"])
        self.mask_token = decoder.id_to_token(self.mask_id) or "[MASK]"
        self.framing = {int(manifest.special_tokens[k]) for k in ("cls", "sep", "pad") if k in manifest.special_tokens}
        self.max_top_k = engine.keep
        self._token_text: dict[int, str] = {}
        if tokenizer.encode([self.mask_token])[0].ids.count(self.mask_id) != 1:  # else no input could have a mask
            raise ValueError(
                f"model {self.name!r}: its tokenizer does not encode the text {self.mask_token!r} to the "
                f"mask id {self.mask_id}; re-export the model (docs/model-directory.md)"
            )
        self.batcher = Batcher(
            self.name,
            engine.forward,
            runtime.run,
            limits,
            gather=list,
            kind="fill-mask",
            gate=runtime.gate,
            packed=lambda: engine.packed,
        )

    @classmethod
    def load(cls, model_dir: ModelDir, settings: Settings, runtime: Runtime) -> FillMaskModel:
        m = model_dir.manifest
        tokenizer = EmbeddingTokenizer(model_dir.file(m.tokenizer["file"]), m.max_input_tokens, TOO_LONG)
        decoder = tokenizing.load(model_dir.file(m.tokenizer["file"]))
        keep = min(MAX_TOP_K, tokenizer.vocab_size)
        pad, mask = int(m.special_tokens["pad"]), int(m.special_tokens["mask"])

        def build(layout: str, session: ort.InferenceSession, variant: str) -> FillMaskEngine | PackedFillMaskEngine:
            if layout == "packed":
                return PackedFillMaskEngine(
                    session, pad, mask, keep, settings.embed_pack_row_tokens, m.name, alignment(variant)
                )
            return FillMaskEngine(session, pad, mask, keep, m.name)

        def masked(ids: list[int]) -> list[int]:  # one mask per input, as a fill-mask call has
            return [ids[0], mask, *ids[2:]]

        variant, engine = encoder_engine(model_dir, settings, runtime, build, masked)
        limits = queue_limits(settings, runtime)  # as Embed's
        return cls(m, tokenizer, decoder, engine, runtime, limits, variant)

    async def start(self) -> None:
        self.batcher.start()

    async def warmup(self) -> None:
        """One real forward pass through the executor; raises if the graph cannot run."""
        (rows,) = await self.runtime.run(self.engine.forward, self.tokenizer.encode([f"warm {self.mask_token} up"]))
        if rows.token_ids.shape != (1, self.max_top_k) or not np.isfinite(rows.scores).all():
            raise RuntimeError(
                f"model {self.name!r}: warm-up gave predictions of shape {rows.token_ids.shape}, "
                f"expected (1, {self.max_top_k})"
            )

    async def stop(self) -> None:
        await self.batcher.stop()

    def info(self) -> dict:
        info = model_info(self, vocab_size=self.tokenizer.vocab_size)
        info["manifest"]["serving.execution"] = self.engine.layout
        info["manifest"]["serving.execution_chosen_by"] = self.engine.chosen_by
        return info

    async def fill(self, texts: list[str], top_k: int = 0, deadline: float | None = None) -> FillResult:
        """Candidates for every mask of every text; `deadline`: time.monotonic() after which queued work is dropped."""
        top_k = top_k or DEFAULT_TOP_K
        if top_k > self.max_top_k:
            raise InvalidArgument(
                f"top_k={top_k} is over the limit of {self.max_top_k} for model {self.name!r}; "
                f"use 1..{self.max_top_k} (0: {DEFAULT_TOP_K})"
            )
        encoded, tokenize_s = await admit_and_encode(
            self.batcher, self.tokenizer, texts, truncate=False, check=lambda e: self._check_masks(e, top_k)
        )
        outcome = await self.batcher.enqueue(encoded, deadline)
        candidates = sum(len(rows.token_ids) for rows in outcome.outputs) * top_k
        if candidates <= INLINE_DECODES:
            results = self._candidates(encoded, outcome.outputs, top_k)
        else:
            results = await asyncio.to_thread(self._candidates, encoded, outcome.outputs, top_k)
        return FillResult(results, outcome.input_tokens, tokenize_s, outcome.queue_s, outcome.inference_s)

    def _check_masks(self, encoded: list[Encoded], top_k: int) -> None:
        total = 0
        for i, e in enumerate(encoded):
            masks = e.ids.count(self.mask_id)
            if masks == 0:
                raise InvalidArgument(
                    f"inputs[{i}] has no {self.mask_token}; write {self.mask_token} where a token "
                    f"is to be predicted, e.g. 'The cat sat on the {self.mask_token}.'"
                )
            if masks > MAX_MASKS:
                raise InvalidArgument(
                    f"inputs[{i}] has {masks} {self.mask_token} tokens; the limit is {MAX_MASKS} per input: split it"
                )
            total += masks
        if total * top_k > MAX_CANDIDATES:
            raise InvalidArgument(
                f"this call asks for {total} masks x top_k {top_k} = {total * top_k} candidates; "
                f"the limit is {MAX_CANDIDATES} per call: lower top_k or split the call"
            )

    def _candidates(self, encoded: list[Encoded], outputs: list[MaskRows], top_k: int) -> list[list[list[Candidate]]]:
        return [self._fill_one(e, rows, top_k) for e, rows in zip(encoded, outputs, strict=True)]

    def _fill_one(self, e: Encoded, rows: MaskRows, top_k: int) -> list[list[Candidate]]:
        """One input: per mask, its top_k candidates with their token text and filled sequence."""
        positions = [p for p, t in enumerate(e.ids) if t == self.mask_id]
        keep = [p for p, t in enumerate(e.ids) if t not in self.framing or p in positions]  # no [CLS]/[SEP]/pad
        single = len(positions) == 1
        out = []
        for position, ids, scores in zip(
            positions, rows.token_ids[:, :top_k].tolist(), rows.scores[:, :top_k].tolist(), strict=True
        ):
            filled = []
            for token_id in ids:
                seq = [token_id if p == position else e.ids[p] for p in keep]
                filled.append(self.decoder.decode(seq, skip_special_tokens=single))
            out.append([Candidate(self._token(t), t, s, q) for t, s, q in zip(ids, scores, filled, strict=True)])
        return out

    def _token(self, token_id: int) -> str:
        """The candidate's own text: decode([id]), as the pipeline's token_str (cached per id)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.decoder.decode([token_id], skip_special_tokens=False)
        return text
