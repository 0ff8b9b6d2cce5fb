"""`AttentionInspector`: one model's attention graph (manifest role "attention"), torch-free.

The graph (export/onnx/attention.py) outputs every layer's attention probabilities, one tensor per
layer and kind, `self_attention.{i}`, `causal_attention.{i}`, `cross_attention.{i}`, each
(1, heads, queries, keys); the inspector reads which it has from the manifest instead of
branching on the model kind. Its session opens on the first call (inspection is rare; a model
directory without the graph serves everything else and answers FAILED_PRECONDITION here).
Inputs are one text, never truncated: longer than the model's `max_input_tokens` is
INVALID_ARGUMENT. A translator is teacher-forced over the target's tokens (decoder inputs: the
start token, then the target without its final EOS); an empty target is first translated
greedily by the model's own TranslationModel. The session run and the statistics
(service/inspection/stats.py) run in the runtime's compute executor.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from service import tokenizing
from service.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from service.inspection.stats import head_stats
from service.manifest import ATTENTION_ROLE, ModelDir
from service.runtime import Runtime

KINDS = {"self_attention": "self", "causal_attention": "causal", "cross_attention": "cross"}  # output prefix


@dataclass(frozen=True)
class AttentionQuery:
    text: str
    target: str = ""  # translator only
    layers: tuple[int, ...] = ()  # empty: all
    heads: tuple[int, ...] = ()
    model: str = ""  # any served model; empty: the default embedding model


@dataclass(frozen=True)
class HeadMap:
    kind: str  # self | causal | cross
    layer: int
    head: int
    weights: np.ndarray  # (queries, keys) float32, rows sum to 1
    stats: np.ndarray  # (5,) in stats.FIELDS order


@dataclass
class AttentionResult:
    source_tokens: list[str]
    target_tokens: list[str]
    target: str
    maps: list[HeadMap]
    input_tokens: int
    output_tokens: int  # tokens translated greedily for an empty target
    tokenize_s: float
    inference_s: float


class AttentionInspector:
    def __init__(self, backend: Any, model_dir: ModelDir, runtime: Runtime, max_bytes: int):
        m = model_dir.manifest
        self.backend, self.model_dir, self.runtime, self.max_bytes = backend, model_dir, runtime, max_bytes
        self.name, self.kind, self.max_input_tokens = m.name, m.kind, m.max_input_tokens
        self.spec = next((g for g in m.graphs if g.role == ATTENTION_ROLE), None)
        self.gate_refused = m.parity.get("attention_ok") is False  # the export left the graph out
        self.gate_diff = m.parity.get("attention_max_abs_diff")
        self.skipped = m.parity.get("attention_skipped")  # not built (a model past 2 GiB of weights)
        self.outputs = (
            []
            if self.spec is None
            else [(KINDS[o.name.split(".")[0]], int(o.name.split(".")[1]), o.name) for o in self.spec.outputs]
        )
        self.n_layers = 1 + max((layer for _, layer, _ in self.outputs), default=-1)
        self.n_heads = int(self.spec.outputs[0].shape[1]) if self.spec else 0
        self.special = np.asarray(sorted({int(v) for v in m.special_tokens.values()}), np.int64)
        self.tokenizer = tokenizing.load(model_dir.file(m.tokenizer["file"]))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.text_encoder = tokenizing.Encoder(self.tokenizer)
        self.chars_per_token = tokenizing.chars_per_token(self.tokenizer)
        self._session = None
        self._opening = asyncio.Lock()

    def check(self, query: AttentionQuery) -> None:
        """Before any work: the graph exists, the text and target apply, the layers and heads exist."""
        if self.spec is None and self.skipped:
            raise FailedPrecondition(
                f"model {self.name!r} is served without attention inspection: the export builds no "
                f"attention graph for a model this large ({self.skipped})"
            )
        if self.spec is None and self.gate_refused:
            raise FailedPrecondition(
                f"model {self.name!r} is served without attention inspection: its attention "
                f"graph differed from PyTorch by {self.gate_diff:.3g} when exported on its build "
                "machine (limit 1e-5), so the export left it out"
            )
        if self.spec is None:
            raise FailedPrecondition(
                f"model {self.name!r} was built without an attention graph; rebuild its "
                "directory with `make models` to inspect its attention"
            )
        if not query.text.strip():
            raise InvalidArgument("text is empty; send the text whose attention to inspect")
        if query.target and self.kind != "translation":
            raise InvalidArgument(f"target applies to translation models only; {self.name!r} is a {self.kind} model")
        bad = [x for x in query.layers if x >= self.n_layers]
        if bad:
            raise InvalidArgument(
                f"layer {bad[0]} does not exist: model {self.name!r} has layers 0..{self.n_layers - 1}"
            )
        bad = [x for x in query.heads if x >= self.n_heads]
        if bad:
            raise InvalidArgument(f"head {bad[0]} does not exist: model {self.name!r} has heads 0..{self.n_heads - 1}")

    async def inspect(self, query: AttentionQuery, deadline: float | None = None) -> AttentionResult:
        """The maps of a query that passed `check` (the core checks it once, before admitting it);
        `deadline` bounds the greedy translation of a translator's missing target and is checked again
        before the graph runs."""
        start = time.perf_counter()
        source = await self._encode(query.text, "text", self.max_input_tokens)
        decoder_ids: list[int] = []
        target, generated = query.target, 0
        if self.kind == "translation":
            target, decoder_ids, generated = await self._target(query.text, query.target, deadline)
        tokenize_s = time.perf_counter() - start
        selected = [o for o in self.outputs if not query.layers or o[1] in query.layers]
        heads = sorted(set(query.heads)) or list(range(self.n_heads))
        self._check_size(selected, len(heads), len(source), len(decoder_ids))
        session = await self._open()
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded(
                f"the call's deadline passed before model {self.name!r}'s attention graph ran; allow more time"
            )
        start = time.perf_counter()
        maps = await self.runtime.run(self._compute, session, selected, heads, source, decoder_ids)
        inference_s = time.perf_counter() - start
        return AttentionResult(
            self._tokens(source),
            self._tokens(decoder_ids),
            target,
            maps,
            len(source) + len(decoder_ids),
            generated,
            tokenize_s,
            inference_s,
        )

    async def _encode(self, text: str, field: str, limit: int) -> list[int]:
        tokenizing.check_chars(
            text, tokenizing.max_chars(limit, self.chars_per_token), field, self.name, limit, "shorten it"
        )
        (encoding,) = await self.text_encoder.encode([text])
        ids = encoding.ids
        if len(ids) > limit:
            raise InvalidArgument(
                f"{field} is {len(ids)} tokens long, over model {self.name!r}'s limit of {limit} tokens; shorten it"
            )
        return ids

    async def _target(self, text: str, target: str, deadline: float | None) -> tuple[str, list[int], int]:
        """-> (target text, decoder input ids, tokens generated): the given target, else the greedy translation."""
        from service.translation.model import TranslateOptions

        model = self.backend
        generated = 0
        if target.strip():
            ids = await self._encode(target, "target", model.max_length)
        else:
            translation = (await model.translate([text], TranslateOptions(), deadline)).translations[0]
            target, ids, generated = translation.text, translation.token_ids, len(translation.token_ids)
        if ids and ids[-1] == model.eos_id:
            ids = ids[:-1]  # the last query is the one that predicts EOS
        return target, [model.start_id, *ids], generated

    def _check_size(self, selected: list, heads: int, source: int, target: int) -> None:
        """INVALID_ARGUMENT before any compute when the maps would not fit in one response message."""
        sizes = {"self": source * source, "causal": (target or source) ** 2, "cross": target * source}
        total = 4 * heads * sum(sizes[kind] for kind, _, _ in selected)  # float32 weights
        if total > self.max_bytes // 2:
            raise InvalidArgument(
                f"the selected maps would take {total / 1e6:.1f} MB, over half the message limit "
                f"of {self.max_bytes / 1e6:.1f} MB; select fewer layers or heads, or a shorter text"
            )

    async def _open(self):
        async with self._opening:
            if self._session is None:
                path = self.model_dir.file(self.spec.file)
                self._session = await self.runtime.run(self.runtime.create_session, path)
        return self._session

    def _compute(
        self, session, selected: list, heads: list[int], source: list[int], decoder: list[int]
    ) -> list[HeadMap]:
        """Runs the graph on one row and cuts out the selected layers and heads, with their statistics."""
        src = np.asarray([source], np.int64)  # (1, S)
        feeds = {"input_ids": src, "attention_mask": np.ones_like(src)}
        if decoder:
            tgt = np.asarray([decoder], np.int64)  # (1, T)
            feeds.update(decoder_input_ids=tgt, decoder_attention_mask=np.ones_like(tgt))
        keys = {"self": src[0], "causal": np.asarray(decoder or source), "cross": src[0]}
        outputs = session.run([name for _, _, name in selected], feeds)
        maps = []
        for (kind, layer, _), probs in zip(selected, outputs):
            chosen = probs[0, heads].astype(np.float32)  # (H', queries, keys)
            stats = head_stats(chosen, np.isin(keys[kind], self.special))
            maps += [HeadMap(kind, layer, h, w, s) for h, w, s in zip(heads, chosen, stats)]
        return maps

    def _tokens(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) or "" for i in ids]
