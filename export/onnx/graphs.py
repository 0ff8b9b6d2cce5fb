"""PyTorch models -> ONNX graphs named as the model directory contract says (service/manifest.py).

Each model family gets a thin wrapper module whose positional inputs and flat outputs carry the
contract's tensor names, exported with the TorchScript exporter (`dynamo=False`, opset 17: its
graphs fuse fully under onnxruntime's transformer optimizer). KV tensors are named
`past_key_values.{i}.key|value` -> `present.{i}.key|value`. The generation decoder's self-attention
is com.microsoft `GroupQueryAttention` over a fixed-length KV buffer that the caller binds as both
past and present, so no step copies the cache; so is the translator decoder's self-attention
(its cross-attention over the source stays plain ops with a mask). Why and how:
docs/design/generation.md, docs/design/translation.md.
Decoders are traced with distinct batch / new / past lengths so no dynamic axis is frozen.
Variants (optimized, fp16, int8, int4) come from the fp32 graph through the `make_*` functions at the
bottom; `graph_io` reads back what a graph file declares.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import onnx
import torch
from torch import nn

from export.models.decoder import DecoderBlock, GPTDecoder, rotate_half
from export.models.families import Encoder
from export.models.layers import padding_mask
from export.models.seq2seq import Translator
from export.onnx import store
from export.onnx.nbits import DEFAULT_INT4, Int4Settings, quantize_nbits
from export.onnx.tied import share_tied_table
from service.manifest import TensorSpec

log = logging.getLogger(__name__)

OPSET = 17
# Example sizes used only for tracing; all different so the exporter cannot confuse the axes.
_B, _T, _P, _S, _L = 2, 5, 3, 7, 4
# GroupQueryAttention rotates only heads of a multiple of 16 values (every real model's: 64, 128);
# smaller heads (the tests' tiny models) get their rotary positions as plain ops before it.
ROTARY_HEAD_MULTIPLE = 16


def _flat(pairs) -> list[torch.Tensor]:
    return [t for kv in pairs for t in kv]


def _pairs(flat) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def kv_names(prefix: str, n_layers: int) -> list[str]:
    """['prefix.0.key', 'prefix.0.value', 'prefix.1.key', ...]"""
    return [f"{prefix}.{i}.{kind}" for i in range(n_layers) for kind in ("key", "value")]


class EncoderGraph(nn.Module):
    """(input_ids, attention_mask) -> sentence_embedding (B, C), pooled, not normalised.

    The model's `padded_hidden` (for BERT, the padding mask in the form onnxruntime's optimizer
    fuses), then its pooling.
    """

    def __init__(self, model: Encoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        x = self.model.padded_hidden(input_ids, attention_mask)  # (B, T, C)
        return self.model.pool(x, attention_mask)  # (B, C)


class _GroupQueryAttention(torch.autograd.Function):
    """Export only: emits com.microsoft GroupQueryAttention on packed QKV (batch, T, (nh + 2 nkv) hs)
    with no separate key and value inputs; with `cos` / `sin` caches (max_positions, hs / 2), its
    own rotary positions (`do_rotary`, non-interleaved: rotate_half's halves) at `position_ids`.
    Its PyTorch forward returns tensors of the right shapes for tracing, not attention: what the
    graph computes is checked against `GPTDecoder` by the parity gate."""

    @staticmethod
    def forward(ctx, qkv, past_k, past_v, seqlens_k, total_length, n_heads, n_kv_heads, cos, sin, position_ids):
        head_size = qkv.shape[-1] // (n_heads + 2 * n_kv_heads)
        return qkv[..., : n_heads * head_size].clone(), past_k.clone(), past_v.clone()

    @staticmethod
    def symbolic(g, qkv, past_k, past_v, seqlens_k, total_length, n_heads, n_kv_heads, cos, sin, position_ids):
        def absent():  # an optional input left empty ("")
            node = g.op("prim::Constant")
            node.setType(torch._C.OptionalType.ofTensor())
            return node

        rotary = [] if cos is None else [cos, sin, position_ids]
        return g.op(
            "com.microsoft::GroupQueryAttention",
            qkv,
            absent(),
            absent(),
            past_k,
            past_v,
            seqlens_k,
            total_length,
            *rotary,
            num_heads_i=n_heads,
            kv_num_heads_i=n_kv_heads,
            **({"do_rotary_i": 1, "rotary_interleaved_i": 0} if rotary else {}),
            outputs=3,
        )


def _rotated(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Rotary positions on the query and key parts of packed QKV (B, T, (nh + 2 nkv) hs), with the
    cos / sin rows of each position (B, T, hs): `Rotary.forward`'s products in (B, T, heads, hs)
    layout, so no transpose."""
    head_size = cos.shape[-1]
    q, k, v = qkv.split([n_heads * head_size, n_kv_heads * head_size, n_kv_heads * head_size], dim=-1)
    cos, sin = cos[:, :, None], sin[:, :, None]  # (B, T, 1, hs)
    q, k = q.unflatten(-1, (n_heads, head_size)), k.unflatten(-1, (n_kv_heads, head_size))  # (B, T, heads, hs)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    return torch.cat([q.flatten(2), k.flatten(2), v], dim=-1)  # (B, T, (nh + 2 nkv) hs)


def _qk_normed(qkv: torch.Tensor, attn) -> torch.Tensor:
    """Qwen3's per-head query and key RMSNorm (`MultiHeadAttention.q_norm` / `k_norm`) on packed QKV
    (B, T, (nh + 2 nkv) hs), in (B, T, heads, hs) layout: the norm is over hs either way."""
    hs, nh, nkv = attn.head_dim, attn.n_heads, attn.n_kv_heads
    q, k, v = qkv.split([nh * hs, nkv * hs, nkv * hs], dim=-1)
    q = attn.q_norm(q.unflatten(-1, (nh, hs))).flatten(2)  # (B, T, nh hs)
    k = attn.k_norm(k.unflatten(-1, (nkv, hs))).flatten(2)  # (B, T, nkv hs)
    return torch.cat([q, k, v], dim=-1)


class DecoderGraph(nn.Module):
    """(input_ids, position_ids, seqlens_k, total_sequence_length, logits_positions, *past) ->
    (logits, *present): `GPTDecoder.forward` with its attention as GroupQueryAttention over a
    fixed-length KV buffer (module doc). The vocabulary projection runs only at `logits_positions`
    (batch, logits_sequence: positions within this pass, per row): a prefill asks for each row's
    last token, scoring and speculation for every position (a 512-token prefill at a 152k
    vocabulary no longer computes and returns 311 MB of logits it drops). Each block's query, key
    and value projections run as one product on the concatenated weights (one GEMM instead of
    three; one activation quantisation in int8). Rotary positions run inside GroupQueryAttention
    (`do_rotary` with the model's cos / sin tables and `position_ids`), after Qwen3's per-head query
    / key norms where the model has them: no rotate-half slices, concatenations and shape glue per
    layer in the graph."""

    def __init__(self, model: GPTDecoder):
        super().__init__()
        self.model = model
        self.qkv = nn.ModuleList(_fused_qkv(block.attn) for block in cast(Iterable[DecoderBlock], model.blocks))

    def forward(self, input_ids, position_ids, seqlens_k, total_sequence_length, logits_positions, *past):
        m = self.model
        x = m.embed(input_ids, position_ids)  # (B, T, C)
        cos = sin = tables = None
        if m.rotary is not None and m.rotary.cos.shape[-1] % ROTARY_HEAD_MULTIPLE == 0:
            half = m.rotary.cos.shape[-1] // 2  # (max_positions, hs / 2): rotate_half's tables hold each half twice
            cos, sin = m.rotary.cos[:, :half].contiguous(), m.rotary.sin[:, :half].contiguous()
        elif m.rotary is not None:  # a head size GroupQueryAttention cannot rotate: plain ops before it
            tables = m.rotary.tables(position_ids)  # (B, T, hs) x 2
        present = []
        for block, qkv, (past_k, past_v) in zip(m.blocks, self.qkv, _pairs(past)):
            attn, h = block.attn, block.ln_attn(x)
            packed = qkv(h)  # (B, T, (nh + 2 nkv) hs)
            if attn.q_norm is not None:
                packed = _qk_normed(packed, attn)
            if tables is not None:
                packed = _rotated(packed, *tables, attn.n_heads, attn.n_kv_heads)
            y, k, v = _GroupQueryAttention.apply(
                packed,
                past_k,
                past_v,
                seqlens_k,
                total_sequence_length,
                attn.n_heads,
                attn.n_kv_heads,
                cos,
                sin,
                position_ids if cos is not None else None,
            )
            x = x + block.dropout(attn.out(y))
            x = x + block.ffn(block.ln_ffn(x))
            present += [k, v]
        h = m.ln_f(x)  # (B, T, C); normalised whole, so the final residual add and norm stay one fused op
        h = torch.gather(h, 1, logits_positions.unsqueeze(-1).expand(-1, -1, h.shape[-1]))  # (B, L, C)
        return (m.logits(h), *present)


class TranslatorEncoderGraph(nn.Module):
    """(input_ids, attention_mask) -> *cross_key_values (one K/V pair per decoder layer)."""

    def __init__(self, model: Translator):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return tuple(_flat(self.model.encode(input_ids, attention_mask)))


class TranslatorDecoderGraph(nn.Module):
    """(input_ids, position_ids, seqlens_k, total_sequence_length, encoder_attention_mask, *cross,
    *past) -> (logits, *present): `Translator.decode` with its self-attention as GroupQueryAttention
    over a fixed-length KV buffer, as the generation decoder's (`DecoderGraph`): each row left-aligned
    in its buffer with its own length in `seqlens_k`, so no row's keys move with its neighbours'
    lengths. (The unfused attention over left-padded targets it replaces summed a row's scores in
    other SIMD lanes when padded: fp32 logits moved by ~1e-6 between alone and batched, which
    row-wise int8's rounding turned into 0.04 and the gate refused.) Cross-attention over the
    right-padded source stays plain ops with its mask. Query, key and value run as one product."""

    def __init__(self, model: Translator):
        super().__init__()
        self.model = model
        self.n_flat = 2 * model.config.n_decoder_layers
        self.qkv = nn.ModuleList(_fused_qkv(layer.self_attn) for layer in model.decoder_layers)

    def forward(self, input_ids, position_ids, seqlens_k, total_sequence_length, encoder_attention_mask, *kv):
        m = self.model
        cross, past = _pairs(kv[: self.n_flat]), _pairs(kv[self.n_flat :])
        x = m._embed(input_ids, position_ids)  # (B, T, C)
        cross_mask = padding_mask(encoder_attention_mask, x.dtype)  # (B, 1, 1, S)
        present = []
        for layer, qkv, (past_k, past_v), cross_kv in zip(m.decoder_layers, self.qkv, past, cross):
            attn = layer.self_attn

            def attend(h, attn=attn, qkv=qkv, past_k=past_k, past_v=past_v):
                y, k, v = _GroupQueryAttention.apply(
                    qkv(h), past_k, past_v, seqlens_k, total_sequence_length, attn.n_heads, attn.n_kv_heads,
                    None, None, None,
                )  # fmt: skip
                return attn.out(y), (k, v)

            x, self_kv = layer.run(x, attend, cross_kv, cross_mask)
            present += self_kv
        return (m.project(x), *present)


def _fused_qkv(attn) -> nn.Linear:
    """One Linear computing attn's query, key and value (their weights concatenated)."""
    parts = (attn.query, attn.key, attn.value)
    fused = nn.Linear(attn.query.in_features, sum(p.out_features for p in parts), bias=attn.query.bias is not None)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
    return fused


def _ids(name: str, *axes: str) -> TensorSpec:
    return TensorSpec(name, "int64", list(axes))


def _kv(names: list[str], heads: int, head_dim: int, length_axis: str, dtype: str) -> list[TensorSpec]:
    return [TensorSpec(n, dtype, ["batch", heads, length_axis, head_dim]) for n in names]


def encoder_specs(model: Encoder) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs = [_ids("input_ids", "batch", "sequence"), _ids("attention_mask", "batch", "sequence")]
    return inputs, [TensorSpec("sentence_embedding", "float32", ["batch", model.config.d_model])]


def decoder_specs(model: GPTDecoder, dtype: str = "float32") -> tuple[list[TensorSpec], list[TensorSpec]]:
    cfg = model.config
    heads, hd = cfg.kv_heads, cfg.head_size  # the cache holds the key / value heads
    inputs = [
        _ids("input_ids", "batch", "sequence"),
        _ids("position_ids", "batch", "sequence"),
        TensorSpec("seqlens_k", "int32", ["batch"]),
        TensorSpec("total_sequence_length", "int32", []),
        _ids("logits_positions", "batch", "logits_sequence"),
    ]
    inputs += _kv(kv_names("past_key_values", cfg.n_layers), heads, hd, "max_sequence", dtype)
    outputs = [TensorSpec("logits", dtype, ["batch", "logits_sequence", cfg.vocab_size])]
    outputs += _kv(kv_names("present", cfg.n_layers), heads, hd, "max_sequence", dtype)
    return inputs, outputs


def translator_specs(model: Translator, dtype: str = "float32") -> dict[str, tuple[list[TensorSpec], list[TensorSpec]]]:
    cfg = model.config
    heads, hd, n = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.n_decoder_layers
    cross = _kv(kv_names("cross_key_values", n), heads, hd, "source_sequence", dtype)
    enc_in = [_ids("input_ids", "batch", "source_sequence"), _ids("attention_mask", "batch", "source_sequence")]
    dec_in = [
        _ids("input_ids", "batch", "sequence"),
        _ids("position_ids", "batch", "sequence"),
        TensorSpec("seqlens_k", "int32", ["batch"]),
        TensorSpec("total_sequence_length", "int32", []),
        _ids("encoder_attention_mask", "batch", "source_sequence"),
    ]
    dec_in += cross + _kv(kv_names("past_key_values", n), heads, hd, "max_sequence", dtype)
    dec_out = [TensorSpec("logits", dtype, ["batch", "sequence", cfg.vocab_size])]
    dec_out += _kv(kv_names("present", n), heads, hd, "max_sequence", dtype)
    return {"encoder": (enc_in, cross), "decoder": (dec_in, dec_out)}


def weight_bytes(module: nn.Module) -> int:
    """The bytes of a module's parameters and buffers: what its exported graph will hold."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _export(
    module: nn.Module, args: tuple, path: Path, inputs: list[TensorSpec], outputs: list[TensorSpec], check: bool = True
) -> Path:
    """torch.onnx.export of module -> where the export lies. `check`: run the ONNX checker now (else
    the caller's `_rewrite` does: each load and check of a 500 MB file costs seconds). A module whose
    weights pass store's inline limit (a 1B model) is exported into a scratch folder beside path,
    where torch writes each tensor to a file of its own; `_rewrite` (called here when `check`) saves
    it at path with its tensors in one data file (export/onnx/store.py) and removes the folder."""
    dynamic_axes = {t.name: {i: a for i, a in enumerate(t.shape) if isinstance(a, str)} for t in inputs + outputs}
    weights = weight_bytes(module)
    target = path
    if weights > store.inline_limit():
        scratch = path.parent / f".{path.name}.export"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        target = scratch / path.name
    with torch.no_grad(), warnings.catch_warnings():
        # head_dim (a fixed model size) is read from a shape in the attention scale: expected.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(
            module.eval(),
            args,
            str(target),
            input_names=[t.name for t in inputs],
            output_names=[t.name for t in outputs],
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )
    log.info("exported %s (%.1f MB of weights)", path.name, weights / 1e6)
    if check:
        if target != path:
            _rewrite(target, path, tied=False)
        else:
            onnx.checker.check_model(str(path))
    return target


def _example_ids(vocab: int, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def _example_kv(batch: int, heads: int, length: int, head_dim: int, count: int) -> list[torch.Tensor]:
    return [torch.randn(batch, heads, length, head_dim) for _ in range(count)]


def export_encoder(model: Encoder, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    inputs, outputs = encoder_specs(model)
    ids = _example_ids(model.config.vocab_size, _B, _T)
    _export(EncoderGraph(model), (ids, torch.ones_like(ids)), path, inputs, outputs)
    return inputs, outputs


def export_decoder(model: GPTDecoder, path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    cfg = model.config
    inputs, outputs = decoder_specs(model)
    ids = _example_ids(cfg.vocab_size, _B, _T)
    positions = torch.arange(_P, _P + _T)[None, :].expand(_B, _T)  # (B, T)
    seqlens = torch.full((_B,), _P + _T - 1, dtype=torch.int32)  # (B,)
    total = torch.tensor(_P + _T, dtype=torch.int32)
    at = torch.randint(0, _T, (_B, _L), generator=torch.Generator().manual_seed(0))  # (B, L)
    past = _example_kv(_B, cfg.kv_heads, _S + _P + _T, cfg.head_size, 2 * cfg.n_layers)
    exported = _export(DecoderGraph(model), (ids, positions, seqlens, total, at, *past), path, inputs, outputs, False)
    _rewrite(exported, path, outputs)  # the custom op's outputs carry no shape of their own
    return inputs, outputs


def _rewrite(src: Path, dst: Path, outputs: list[TensorSpec] | None = None, tied: bool = True) -> None:
    """One load, rewrite, save and check of an exported graph (src, saved at dst): the contract's
    output shapes (`outputs`, where the export cannot give them) and the tied embedding table stored
    once (export/onnx/tied.py), where the head is tied. A src in a scratch folder (`_export`) is
    saved at dst with its tensors in one data file when it is that big, and the folder removed."""
    model = store.load(src)
    if outputs is not None:
        _declare_output_shapes(model, outputs)
    tied = tied and share_tied_table(model)
    if outputs is not None or tied or src != dst:
        store.save(model, dst)
    del model
    if src != dst:
        shutil.rmtree(src.parent, ignore_errors=True)
    onnx.checker.check_model(str(dst))
    if tied:
        log.info("%s: the tied head reads the embedding table (%.1f MB)", dst.name, _size(dst) / 1e6)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in store.files(path))


def _declare_output_shapes(model: onnx.ModelProto, outputs: list[TensorSpec]) -> None:
    """Writes the contract's shapes (fixed sizes, named dynamic axes) onto the graph's outputs."""
    specs = {t.name: t for t in outputs}
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        del dims[:]
        for axis in specs[out.name].shape:
            dim = dims.add()
            if isinstance(axis, int):
                dim.dim_value = axis
            else:
                dim.dim_param = axis


def export_translator(model: Translator, encoder_path: Path, decoder_path: Path) -> dict:
    """Two graphs; returns {"encoder": (inputs, outputs), "decoder": (inputs, outputs)}."""
    cfg = model.config
    specs = translator_specs(model)
    heads, hd, n = cfg.n_heads, cfg.d_model // cfg.n_heads, cfg.n_decoder_layers
    src = _example_ids(cfg.vocab_size, _B, _S)
    _export(TranslatorEncoderGraph(model), (src, torch.ones_like(src)), encoder_path, *specs["encoder"])
    tgt = _example_ids(cfg.vocab_size, _B, _T)
    positions = torch.arange(_P, _P + _T)[None, :].expand(_B, _T)  # (B, T)
    seqlens = torch.full((_B,), _P + _T - 1, dtype=torch.int32)  # (B,)
    total = torch.tensor(_P + _T, dtype=torch.int32)
    cross = _example_kv(_B, heads, _S, hd, 2 * n)
    past = _example_kv(_B, heads, _L + _P + _T, hd, 2 * n)  # the buffer: longer than any row
    args = (tgt, positions, seqlens, total, torch.ones_like(src), *cross, *past)
    exported = _export(TranslatorDecoderGraph(model), args, decoder_path, *specs["decoder"], check=False)
    _rewrite(exported, decoder_path, specs["decoder"][1])  # the custom op's outputs carry no shape of their own
    return specs


# ---- variants, derived from the fp32 graph; the gate measures each against PyTorch ---------------


HOLD_MIN_BYTES = 1 << 20  # weight matrices and tables; biases, norm scales and shapes stay readable


def make_optimized(src: Path, dst: Path, model_type: str, n_heads: int, d_model: int) -> dict[str, int]:
    """onnxruntime's transformer optimizer (fusions); -> the fused operator counts.

    model_type "bert" for encoders (EmbedLayerNormalization, Attention, BiasGelu,
    SkipLayerNormalization), "gpt2" for decoders (LayerNorm / Gelu / SkipLayerNorm fusions; our
    mask-and-cache attention is left unfused, which the gate checks is still exact).

    A decoder's graph is optimized with its weight matrices held aside (store.hold_weights): the
    optimizer's symbolic shape inference serializes and copies the model several times, which
    took 4 of its 7.7 s on GPT-2 small's 583 MB (3.6 s now), and refuses a model past protobuf's
    2 GiB (held aside, a 1.1B Llama's fuses: export/build.py says why such a model gets none). The decoder
    fusions read no weight matrix; one that did would fail loudly, and so would a shape inference
    that failed without them: the whole graph is optimized then, as it always was. The graph
    written is the same either way (tests/export/test_export_optimize.py). An encoder's graph is
    optimized whole: BERT's Attention fusion joins its Q, K and V matrices into one.
    """
    from onnxruntime.transformers.optimizer import optimize_model

    shape = {"model_type": model_type, "num_heads": n_heads, "hidden_size": d_model, "opt_level": 0}
    model, how = None, "weights held aside"
    if model_type != "bert":
        model = _optimize_held(store.load(src), shape)
    if model is None:
        model, how = optimize_model(store.load(src), **shape), "whole graph"
    store.data_file(dst).unlink(missing_ok=True)
    big = store.external(model.model)  # its tensors beside it, as store.save does (same file name)
    model.save_model_to_file(str(dst), use_external_data_format=big, size_threshold=store.MIN_EXTERNAL_TENSOR)
    if big:
        store.data_file(dst).chmod(0o644)
    counts = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
    log.info("optimized %s -> %s (%s): %s", src.name, dst.name, how, counts)
    return counts


def _optimize_held(model: onnx.ModelProto, shape: dict):
    """optimize_model(model, **shape) with the model's weights held aside (model changed in place)
    -> the optimizer's OnnxModel with them back, or None where a fusion read one, shape inference
    failed without them, or one was copied under a new name."""
    from onnxruntime.transformers.optimizer import optimize_model

    held = store.hold_weights(model, HOLD_MIN_BYTES)
    try:
        optimized = optimize_model(model, **shape)
    except onnx.checker.ValidationError as e:  # onnx's reader, asked for a held weight
        if store.HELD not in str(e):
            raise
        log.info("optimizer: a fusion reads a weight matrix (%s); running it on the whole graph", e)
        return None
    if not optimized.enable_shape_infer:  # the optimizer turns it off where it failed
        log.info("optimizer: shape inference failed with the weights held aside; running it on the whole graph")
        return None
    if missing := store.restore_weights(optimized.model, held):
        log.info("optimizer: held weights copied under new names (%s); running it on the whole graph", missing[:3])
        return None
    return optimized


def make_fp16(src: Path, dst: Path, keep_io_types: bool) -> None:
    """float16 weights and compute (for GPU). keep_io_types=True keeps float32 inputs/outputs.

    The converter clamps constants to +-1e4, so the masks' float32 minimum becomes -1e4 rather
    than -inf and a fully masked row still gives finite values. It types the graph first: onnx's
    `infer_shapes_path` does that on the files, and the converter runs without its own shape
    inference, which serializes the model in memory (refused past protobuf's 2 GiB; on GPT-2
    small's 583 MB the same file in 6.7 instead of 8.3 s and 1.3 instead of 2.5 GB).
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16

    typed = dst.with_name(f".{src.name}.typed.onnx")  # beside src: its data file's name still resolves
    try:
        onnx.shape_inference.infer_shapes_path(str(src), str(typed))
        model = convert_float_to_float16(store.load(typed), keep_io_types=keep_io_types, disable_shape_infer=True)
    finally:
        typed.unlink(missing_ok=True)
    store.save(model, dst)


def make_int8(src: Path, dst: Path, keep_down: bool = False) -> dict:
    """int8 for the CPU (export/onnx/quantize.py): u8 x s8 integer GEMMs with one activation scale per
    row (per token), computed at run time, and 7-bit weights per output column. A row's result does
    not depend on the other rows of its batch, which batching with strangers needs (parity.py checks
    it), and the GEMM gains from more rows. Encoders and decoders alike. (onnxruntime's
    `quantize_dynamic`, used for encoders before, scales activations per tensor: a MiniLM embedding
    moved by 0.11 between alone and batched. The weight-only `MatMulNBits` used for decoders before
    is batch-invariant but gains little from more rows: docs/design/export.md.) Embedding tables
    at 8 bits (export/onnx/tables.py); -> what that did. `keep_down`: down
    projections stay fp32 (quantize_rowwise; export/build.py retries a failed encoder so).
    """
    from export.onnx.quantize import quantize_rowwise
    from export.onnx.tables import quantize_tables_file

    quantize_rowwise(src, dst, keep_down=keep_down)
    return quantize_tables_file(dst)


def make_int4(src: Path, dst: Path, settings: Int4Settings = DEFAULT_INT4) -> dict:
    """4-bit block-wise weights for the CPU (export/onnx/nbits.py): onnxruntime's `MatMulNBits`
    with int8 compute, embedding tables at 8 bits (export/onnx/tables.py), with the quantiser
    settings given; -> its settings (bits, head bits, block size,
    symmetric, accuracy level, MatMuls rewritten, tables)."""
    from export.onnx.tables import quantize_tables_file

    return {**quantize_nbits(src, dst, settings), "tables": quantize_tables_file(dst)}


_ONNX_DTYPES = {
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT32: "int32",
}


def graph_io(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs and outputs an ONNX file really declares (names, dtypes, fixed / named axes)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}

    def spec(value) -> TensorSpec:
        t = value.type.tensor_type
        shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        return TensorSpec(value.name, _ONNX_DTYPES.get(t.elem_type, str(t.elem_type)), shape)

    return [spec(v) for v in graph.input if v.name not in initializers], [spec(v) for v in graph.output]
