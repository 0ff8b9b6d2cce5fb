"""Block-wise weight-only quantisation of decoder graphs: onnxruntime's `MatMulNBits`.

Every MatMul with a constant weight (the tied head included, export/onnx/tied.py) becomes
com.microsoft `MatMulNBits` through onnxruntime's own quantiser
(`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`): asymmetric weights with
one scale and zero point per block of `BLOCK_SIZE` values along the input axis, 4 bits in the
blocks, 8 bits (`HEAD_BITS`) in the vocabulary projection, whose rounding moves the most likely
token most directly. `accuracy_level` 4 computes with int8 activations, quantised per row and
block inside the kernel, so onnxruntime's integer kernels (AVX2, AVX-512, VNNI) run and a row
never sees the other rows of its batch; level 0 dequantises to fp32 and ran at half the speed.
Why these settings (the trained generator's held-out quality per setting, timings on the CPU):
docs/design/export.md. `Int4Settings` lets a conversion trade quality for bytes per token (larger
blocks, symmetric blocks, a 4-bit head: onnxruntime-genai's int4 is blocks of 32, symmetric, 4-bit
head); the manifest records what was used, and the gate judges the result like int8
(export/gate/parity.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnx

from export.onnx import store
from export.onnx.tied import untied_matmul

log = logging.getLogger(__name__)

BITS = 4
HEAD_BITS = 8
BLOCK_SIZE = 32
ACCURACY_LEVEL = 4  # int8 compute: onnxruntime's integer kernels (0: fp32 compute)
BLOCK_SIZES = (16, 32, 64, 128, 256)  # what MatMulNBits takes: a power of two from 16
HEAD_BITS_CHOICES = (4, 8)


@dataclass(frozen=True)
class Int4Settings:
    """The block-wise quantiser's choices (defaults: the most accurate on the trained generator)."""

    block_size: int = BLOCK_SIZE  # values per scale along the input axis
    head_bits: int = HEAD_BITS  # the vocabulary projection: 8 or 4
    symmetric: bool = False  # no zero point per block (half a byte less per block, coarser)

    def __post_init__(self):
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"int4 block size {self.block_size}: one of {', '.join(map(str, BLOCK_SIZES))}")
        if self.head_bits not in HEAD_BITS_CHOICES:
            raise ValueError(f"int4 head bits {self.head_bits}: 4 or 8")


DEFAULT_INT4 = Int4Settings()


def _head_nodes(model: onnx.ModelProto) -> list[str]:
    """The MatMuls projecting onto the vocabulary: constant weights (C, V), V the logits' last axis."""
    graph = model.graph
    logits = next(o for o in graph.output if o.name == "logits")
    vocab = logits.type.tensor_type.shape.dim[-1].dim_value
    weights = {i.name: i.dims for i in graph.initializer}
    return [
        n.name
        for n in graph.node
        if n.op_type == "MatMul" and len(weights.get(n.input[1], ())) == 2 and weights[n.input[1]][1] == vocab
    ]


def _quantize(model: onnx.ModelProto, bits: int, exclude: list[str], settings: Int4Settings) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        model,
        bits=bits,
        block_size=settings.block_size,
        is_symmetric=settings.symmetric,
        accuracy_level=ACCURACY_LEVEL,
        nodes_to_exclude=exclude,
    )
    quantizer.process()
    return quantizer.model.model


def quantize_nbits(src: Path, dst: Path, chosen: Int4Settings = DEFAULT_INT4) -> dict:
    """src (fp32 ONNX) -> dst with MatMulNBits; -> the settings and how many MatMuls were rewritten."""
    model = untied_matmul(store.load(src))
    head = _head_nodes(model)
    model = _quantize(model, BITS, head, chosen)
    model = _quantize(model, chosen.head_bits, [], chosen)  # the head is all that is left
    store.save(model, dst)
    rewritten = sum(1 for n in model.graph.node if n.op_type == "MatMulNBits")
    figures = {
        "bits": BITS,
        "head_bits": chosen.head_bits,
        "block_size": chosen.block_size,
        "symmetric": chosen.symmetric,
        "accuracy_level": ACCURACY_LEVEL,
        "matmuls": rewritten,
    }
    log.info("%s -> %s: %s", src.name, dst.name, figures)
    return figures
