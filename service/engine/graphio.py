"""What a decoder graph takes and returns (`GraphIO`), read once from its session, and device placement.

`GraphIO.inspect(session)` asks an onnxruntime session at load what the decoder needs: the
`past_key_values.{i}.key|value` inputs (hence the number of layers), heads H and head size D (from
the input shapes, or from the manifest when the graph leaves them symbolic), the KV dtype, and any
extra inputs (a translator's `encoder_attention_mask` and `cross_key_values.*`; a generation
decoder's `logits_positions`). Shared by the
generation and translation engines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.runtime import CUDA

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


@dataclass(frozen=True)
class GraphIO:
    """What a decoder graph takes and returns, read from the session."""

    past_names: tuple[str, ...]  # past_key_values.0.key, .0.value, .1.key, ...
    present_names: tuple[str, ...]  # present.0.key, ...
    input_names: tuple[str, ...]
    n_layers: int
    n_heads: int
    head_dim: int
    kv_dtype: type
    vocab_size: int
    buffer_kv: bool = False  # GroupQueryAttention over a fixed-length KV buffer (`seqlens_k` input)
    # The vocabulary projection only at the positions a `logits_positions` input names (graphs
    # exported before it had none: logits at every position).
    logits_positions: bool = False

    @staticmethod
    def inspect(session: ort.InferenceSession, architecture: dict) -> GraphIO:
        inputs = {i.name: i for i in session.get_inputs()}
        layers = sorted({int(m.group(1)) for n in inputs if (m := _PAST.match(n))})
        if not layers or layers != list(range(len(layers))):
            raise ValueError(
                f"decoder graph has no past_key_values.{{i}}.key|value inputs (inputs: {', '.join(inputs)})"
            )
        past = tuple(f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value"))
        present = tuple(f"present.{i}.{kv}" for i in layers for kv in ("key", "value"))
        missing = set(present) - {o.name for o in session.get_outputs()}
        if missing:
            raise ValueError(f"decoder graph lacks outputs {', '.join(sorted(missing))}")
        spec = inputs[past[0]]
        _, heads, _, head_dim = spec.shape
        if not isinstance(heads, int) or not isinstance(head_dim, int):  # the cache holds the KV heads (GQA)
            heads = int(architecture.get("n_kv_heads") or architecture["n_heads"])
            head_dim = int(architecture.get("head_dim") or int(architecture["d_model"]) // int(architecture["n_heads"]))
        logits = next(o for o in session.get_outputs() if o.name == "logits")
        vocab = logits.shape[-1] if isinstance(logits.shape[-1], int) else int(architecture["vocab_size"])
        return GraphIO(
            past,
            present,
            tuple(inputs),
            len(layers),
            heads,
            head_dim,
            _ORT_DTYPES.get(spec.type, np.float32),
            vocab,
            buffer_kv="seqlens_k" in inputs,
            logits_positions="logits_positions" in inputs,
        )


def to_device(arrays: dict[str, np.ndarray], device: str | None) -> dict:
    """Constant inputs where the step runs them: as is for numpy, else OrtValues on the device."""
    if device is None:
        return arrays
    return {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), device, 0) for k, v in arrays.items()}


def attention_off_device(provider: str, io: GraphIO) -> str | None:
    """Why this decoder's attention cannot run on its session's device, or None (generation and
    translation decoders alike).

    onnxruntime registers its CUDA GroupQueryAttention kernel for float16 and bfloat16 only
    (contrib_ops/cuda/bert/group_query_attention.cc), so a float32 decoder's attention runs on the
    CPU provider. IO binding then copies the bound device inputs to the host once, when bound: every
    step read stale values (seqlens_k garbage, "out of range", on an H200 with onnxruntime 1.31.1).
    Such a decoder is served unbound (docs/design/gpu.md)."""
    if provider == CUDA and np.dtype(io.kv_dtype) == np.float32:
        return (
            "onnxruntime's CUDA GroupQueryAttention takes float16 and bfloat16 only, "
            "so this float32 decoder's attention runs on the CPU"
        )
    return None
