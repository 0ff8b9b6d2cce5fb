"""The embedding engines: one onnxruntime encoder session each, numpy post-processing.

`EmbeddingEngine` runs the padded graph (role `encoder`): the session is introspected once at
load (which of input_ids / attention_mask / token_type_ids it takes, with which integer dtype; its
output sentence_embedding (B, C), pooled and not normalised: export/models/encoder.py) and each batch is
padded to its longest row. `PackedEmbeddingEngine` runs the packed graph (role `packed`,
export/onnx/packed.py): inputs side by side in rows of `row_tokens` (packing.py), pooled per input here.
Both count the tokens they compute and the padding among them (`ts_batch_tokens`,
`ts_batch_padding_ratio`). `forward` is blocking and runs in the runtime's compute executor; it
never sees protobuf. `postprocess` keeps the first `dimensions` values and L2-normalises
(Matryoshka-style truncation, then re-normalisation).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, TypeVar, cast

import numpy as np
import onnxruntime as ort

from service import metrics
from service.engine.packing import Packed, pack, pool, split_runs
from service.engine.tokenization import Encoded

_KNOWN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_ORT_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}

Out = TypeVar("Out")  # what `forward` returns for a batch: embeddings (B, C), or fill-mask's MaskRows


class EncoderEngine(ABC, Generic[Out]):
    """What every encoder engine shares: the session, the pad id, the provider, the token counts."""

    packed = False
    counted = True  # False while the load times the layouts (service/engine/layout.py)
    chosen_by = ""  # why this engine's layout (packed / padded) serves: layout.encoder_engine

    def __init__(self, session: ort.InferenceSession, pad_id: int, model: str = ""):
        self.session, self.pad_id = session, pad_id
        self.provider = session.get_providers()[0]
        self._computed = metrics.BATCH_TOKENS.labels(model)
        self._padding = metrics.PADDING_RATIO.labels(model)

    @property
    def layout(self) -> str:
        return "packed" if self.packed else "padded"

    def count(self, computed: int, real: int) -> None:
        """Tokens one forward pass computes, and how many of them are padding (computed / real)."""
        if not self.counted:
            return
        self._computed.observe(computed)
        self._padding.observe(computed / max(real, 1))

    @abstractmethod
    def forward(self, batch: list[Encoded]) -> Out:
        """The batch's result, in batch order. Blocking: run it in the executor."""


class PaddedEncoder(EncoderEngine[Out]):
    """The padded graph (role `encoder`): each batch padded to its longest row, or, once
    `pass_tokens` is measured (service/engine/layout.py `measure_pass`), in runs of similar length
    padded each to its own longest (packing.split_runs), where that computes less."""

    # What one more session pass costs, in padded tokens, on this model and CPU; None: every batch
    # is one pass (not measured: a GPU, whose passes want whole batches).
    pass_tokens: float | None = None
    runs_by_length = False  # this engine's forward runs a batch through `in_runs` (the load measures a pass)

    def __init__(self, session: ort.InferenceSession, pad_id: int, model: str = ""):
        super().__init__(session, pad_id, model)
        self.input_types = {}
        for node in session.get_inputs():
            if node.name not in _KNOWN_INPUTS or node.type not in _ORT_INT_TYPES:
                raise ValueError(
                    f"encoder graph input {node.name} ({node.type}) is not one of "
                    f"{', '.join(_KNOWN_INPUTS)} as int32/int64"
                )
            self.input_types[node.name] = _ORT_INT_TYPES[node.type]
        if "input_ids" not in self.input_types:
            raise ValueError("encoder graph has no input_ids input")
        outputs = [o.name for o in session.get_outputs()]
        self.output = "sentence_embedding" if "sentence_embedding" in outputs else outputs[0]

    def feeds(self, batch: list[Encoded]) -> dict[str, np.ndarray]:
        """Pads the batch to its longest row: input_ids / attention_mask / token_type_ids, (B, T)."""
        rows, width = len(batch), max(len(e) for e in batch)
        ids = np.full((rows, width), self.pad_id, dtype=np.int64)  # (B, T)
        types = np.zeros((rows, width), dtype=np.int64)  # (B, T)
        mask = np.zeros((rows, width), dtype=np.int64)  # (B, T)
        for r, e in enumerate(batch):
            ids[r, : len(e)] = e.ids
            types[r, : len(e)] = e.type_ids
            mask[r, : len(e)] = 1
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        self.count(ids.size, int(mask.sum()))
        return {name: arrays[name].astype(dtype, copy=False) for name, dtype in self.input_types.items()}

    def in_runs(self, batch: list[Encoded], run: Callable[[list[Encoded]], Out]) -> Out:
        """run(inputs) -> one result row per input (an (n, ...) array or a list), over the batch's
        runs of similar length; the rows in batch order, as `run(batch)` gives them."""
        runs = [[0]] if self.pass_tokens is None else split_runs([len(e) for e in batch], self.pass_tokens)
        if len(runs) == 1:
            return run(batch)
        parts = [run([batch[i] for i in of]) for of in runs]
        where = np.argsort(np.concatenate(runs))  # each input's place among the parts' rows, in order
        if isinstance(parts[0], np.ndarray):
            return cast(Out, np.concatenate(cast(list[np.ndarray], parts))[where])
        rows = [row for part in parts for row in cast(list, part)]
        return cast(Out, [rows[j] for j in where])


class EmbeddingEngine(PaddedEncoder[np.ndarray]):
    runs_by_length = True

    def forward(self, batch: list[Encoded]) -> np.ndarray:
        """(B, C) float32 pooled embeddings, not normalised. Blocking: run it in the executor."""
        return self.in_runs(batch, self._pass)

    def _pass(self, inputs: list[Encoded]) -> np.ndarray:
        (out,) = self.session.run([self.output], self.feeds(inputs))
        return np.asarray(out, dtype=np.float32)


class PackedEncoder(EncoderEngine[Out]):
    """The packed graph (role `packed`): inputs side by side in rows of `row_tokens`."""

    packed = True
    INPUTS = ("input_ids", "position_ids", "segment_ids")

    def __init__(
        self,
        session: ort.InferenceSession,
        pad_id: int,
        row_tokens: int,
        pooling: str = "mean",
        model: str = "",
        align: int = 1,
    ):
        super().__init__(session, pad_id, model)
        self.row_tokens, self.pooling = row_tokens, pooling
        self.align = align  # packing.alignment(variant)
        names = [i.name for i in session.get_inputs()]
        if not set(self.INPUTS) <= set(names):
            raise ValueError(f"packed graph inputs {', '.join(names)} lack {', '.join(set(self.INPUTS) - set(names))}")
        self.output = session.get_outputs()[0].name

    def pack(self, batch: list[Encoded]) -> Packed:
        """Rows of row_tokens, widened to the batch's longest input (as the export's gate packs)."""
        width = max(self.row_tokens, max(len(e) for e in batch))
        packed = pack([e.ids for e in batch], width, self.pad_id, self.align)
        self.count(packed.computed_tokens, int(packed.length.sum()))
        return packed

    def feeds(self, packed: Packed) -> dict[str, np.ndarray]:
        return {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "segment_ids": packed.segment_ids}


class PackedEmbeddingEngine(PackedEncoder[np.ndarray]):
    """The packed graph: (input_ids, position_ids, segment_ids) (rows, length) -> token_embeddings
    (rows, length, C), pooled here per input (`pooling`: mean, cls, max or last, the manifest's)."""

    def forward(self, batch: list[Encoded]) -> np.ndarray:
        """(B, C) float32 pooled embeddings, not normalised, in batch order. Blocking."""
        packed = self.pack(batch)
        (hidden,) = self.session.run([self.output], self.feeds(packed))  # (R, L, C)
        return pool(np.asarray(hidden), packed, self.pooling)


def postprocess(embeddings: np.ndarray, normalize: bool, dimensions: int) -> np.ndarray:
    """(N, C) -> (N, dimensions or C): keep the first `dimensions` values, then L2-normalise if asked."""
    out = embeddings[:, :dimensions] if dimensions else embeddings  # (N, D)
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)  # (N, 1)
        out = out / np.maximum(norms, 1e-12)
    return out.astype(np.float32, copy=False)
