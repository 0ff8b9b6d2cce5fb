"""Block-wise weight-only quantisation of decoder graphs: onnxruntime's `MatMulNBits`.

Every MatMul with a constant weight (the tied head included, export/onnx/tied.py) becomes
com.microsoft `MatMulNBits` through onnxruntime's own quantiser
(`onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`): `bits`-bit weights,
one scale and zero point per block of `block_size` values along the input axis. A decode step
then reads a quarter (4 bits) of the fp32 weight bytes. `accuracy_level` 4 computes with int8
activations, quantised per row and block inside the kernel, so onnxruntime's integer kernels
(AVX2, AVX-512, VNNI) run and a row never sees the other rows of its batch; level 0 dequantises
to fp32. Which level and block size, and what they cost: docs/design/export.md; figures per CPU:
docs/performance.md. The gate judges the result like int8 (export/gate/parity.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

from export.onnx.tied import untied_matmul

log = logging.getLogger(__name__)

BLOCK_SIZE = 32
ACCURACY_LEVEL = 4  # int8 compute: onnxruntime's integer kernels (0: fp32 compute)


def quantize_nbits(
    src: Path, dst: Path, bits: int = 4, block_size: int = BLOCK_SIZE, accuracy_level: int = ACCURACY_LEVEL
) -> dict:
    """src (fp32 ONNX) -> dst with MatMulNBits; -> the settings and how many MatMuls were rewritten."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = untied_matmul(onnx.load(str(src)))
    quantizer = MatMulNBitsQuantizer(
        model, bits=bits, block_size=block_size, is_symmetric=False, accuracy_level=accuracy_level
    )
    quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)
    rewritten = sum(1 for n in quantizer.model.model.graph.node if n.op_type == "MatMulNBits")
    log.info(
        "%s -> %s: %d MatMulNBits (%d bits, blocks of %d, accuracy level %d)",
        src.name,
        dst.name,
        rewritten,
        bits,
        block_size,
        accuracy_level,
    )
    return {"bits": bits, "block_size": block_size, "accuracy_level": accuracy_level, "matmuls": rewritten}
