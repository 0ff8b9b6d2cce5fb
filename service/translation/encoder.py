"""The translator's encoder run: newcomer sources -> cross-attention K/V, packed or padded.

A padded run pads every source to the longest of the newcomers. Where the model directory has a
packed encoder graph (export/onnx/packed.py) and `embed_pack_row_tokens` is not 0, the sources are
packed as embedding batches are (service/engine/packing.py: several per row, attention confined
to each) and the graph gathers each source's K/V back into the padded (n, nkv, S, hs) layout the
decoder graph reads (`unpack`): the decoder, its cache and the search do not change. The export's
gate packs through this module too, so what it measured is what runs (docs/design/packing.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from service.engine.packing import Packed, pack
from service.engine.packing import alignment as encoder_alignment
from service.manifest import PACKED_ROLE, Manifest

log = logging.getLogger(__name__)

# Where a source may start in a packed row, per variant (service/engine/packing.py explains why
# reduced precision needs it): the cross K/V are not pooled, so fp16's rounding on the CPU moved a
# source by 2e-3 among neighbours at offsets that are not multiples of 4 (0.0 aligned; tiny model).
# int8 sources start at multiples of the CPU's SIMD width, as an encoder's inputs do; fp16 at 16.
PACKED_INPUT = "unpack_index"


def alignment(variant: str) -> int:
    return 16 if variant == "fp16" else encoder_alignment(variant)


def unpack(packed: Packed) -> tuple[np.ndarray, np.ndarray]:
    """(B, S) flat index of each source's tokens in the packed rows (slots past a source's length
    repeat its first token: the decoder's source mask hides them) and the (B, S) source mask."""
    width = int(packed.length.max())
    offsets = np.arange(width)[None, :]  # (1, S)
    mask = offsets < packed.length[:, None]  # (B, S)
    first = packed.row * packed.input_ids.shape[1] + packed.start  # (B,)
    return first[:, None] + np.where(mask, offsets, 0), mask.astype(np.int64)


def packed_feeds(
    seqs: Sequence[Sequence[int]], row_tokens: int, pad_id: int, align: int
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """(graph inputs, source mask (B, S), tokens computed) of a packed encoder run."""
    packed = pack(seqs, max(row_tokens, max(len(s) for s in seqs)), pad_id, align)
    index, mask = unpack(packed)
    feeds = {
        "input_ids": packed.input_ids,
        "position_ids": packed.position_ids,
        "segment_ids": packed.segment_ids,
        "unpack_index": index,
    }
    return feeds, mask, packed.computed_tokens


def padded_feeds(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    longest = max(len(s) for s in seqs)
    ids = np.full((len(seqs), longest), pad_id, np.int64)  # (n, S)
    mask = np.zeros((len(seqs), longest), np.int64)  # (n, S)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = s, 1
    return {"input_ids": ids, "attention_mask": mask}, mask, int(ids.size)


def feeds(
    seqs: Sequence[Sequence[int]], pad_id: int, row_tokens: int | None, align: int = 1
) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """The encoder run of seqs: (graph inputs, source mask (n, S), tokens computed); row_tokens
    None: a padded graph's inputs, else a packed graph's (rows of at least row_tokens)."""
    if row_tokens is None:
        return padded_feeds(seqs, pad_id)
    return packed_feeds(seqs, row_tokens, pad_id, align)


def is_packed(session) -> bool:
    """Whether an encoder session is a packed graph (it asks for `unpack_index`)."""
    return PACKED_INPUT in {i.name for i in session.get_inputs()}


def packed_ok(manifest: Manifest, variant: str) -> bool:
    """Whether the directory has a packed encoder of this variant that its gate passed: fp32 and
    optimized must match PyTorch token for token to be written at all; reduced precision must keep
    its quality and each source independent of its neighbours (`quality_ok` of the packed figures)."""
    if variant not in manifest.variants(PACKED_ROLE):
        return False
    figures = manifest.graph(PACKED_ROLE, variant).parity.get("packed", {})
    return bool(figures.get("quality_ok", figures.get("greedy_identical", False)))


def encoder_graph(manifest: Manifest, variant: str, row_tokens: int) -> tuple[str, str]:
    """(role, variant) of the encoder graph to serve beside the decoder's variant: the packed one
    where the gate passed it and row_tokens (settings `embed_pack_row_tokens`) is not 0."""
    enc_variant = variant if variant in manifest.variants("encoder") else "fp32"
    if row_tokens and packed_ok(manifest, enc_variant):
        return PACKED_ROLE, enc_variant
    return "encoder", enc_variant
