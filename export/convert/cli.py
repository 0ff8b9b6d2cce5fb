"""`python -m export convert PATH --out MODELS_DIR`: a local Hugging Face folder -> a model directory."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from export.convert import KINDS, ConversionError, Options, convert, default_name
from export.gate import parity
from export.onnx import nbits

log = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    from export.build import VARIANT_ORDER
    from export.cli import DEFAULT_VARIANTS

    p = argparse.ArgumentParser(
        prog="python -m export convert",
        description="Convert a local Hugging Face folder (BERT, RoBERTa, XLM-R, ModernBERT, GPT-2, Llama, Mistral, "
        "Qwen2, Marian) into a model directory, through the parity gate. Never downloads.",
    )
    p.add_argument("command", choices=["convert"], help=argparse.SUPPRESS)
    p.add_argument("path", type=Path, help="the folder: config.json, weights, tokenizer files")
    p.add_argument("--out", required=True, type=Path, help="the models folder; the model is written to OUT/NAME")
    p.add_argument("--name", help="the model's name (default: the folder's name, lower case)")
    p.add_argument("--kind", choices=KINDS, help="default: from config.json's architectures and modules.json")
    p.add_argument(
        "--pooling",
        choices=["mean", "cls", "max"],
        help="embedding pooling (default: 1_Pooling/config.json, else mean)",
    )
    p.add_argument("--max-input-tokens", type=int, help="longest input accepted (default: from the folder)")
    p.add_argument("--max-output-tokens", type=int, help="generation/translation: most new tokens (default: context)")
    p.add_argument(
        "--chat-template",
        type=Path,
        help="generation: a Jinja chat template file to store instead of the folder's (a base model has none)",
    )
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, from {','.join(VARIANT_ORDER)}")
    p.add_argument(
        "--int4-block-size",
        type=int,
        default=nbits.BLOCK_SIZE,
        choices=nbits.BLOCK_SIZES,
        help="generation, int4: weights per scale along the input axis (larger: fewer bytes, coarser)",
    )
    p.add_argument(
        "--int4-head-bits",
        type=int,
        default=nbits.HEAD_BITS,
        choices=nbits.HEAD_BITS_CHOICES,
        help="generation, int4: bits of the vocabulary projection",
    )
    p.add_argument(
        "--int4-symmetric",
        action="store_true",
        help="generation, int4: no zero point per block (onnxruntime-genai's int4 is 32, symmetric, a 4-bit head)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="auto: CUDA when PyTorch sees a GPU; there the fp16 graphs are also gated on it",
    )
    return p


def main(argv: list[str]) -> int:
    from export import memory
    from export.cli import _variant_list
    from export.gate import gpu_gate

    args = _parser().parse_args(argv)
    memory.settle()  # a 1B checkpoint's copies given back between stages (export/memory.py)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("export").setLevel(logging.INFO)
    name = args.name or default_name(args.path)
    options = Options(
        kind=args.kind,
        pooling=args.pooling,
        max_input_tokens=args.max_input_tokens,
        max_output_tokens=args.max_output_tokens,
        chat_template=args.chat_template,
        int4=nbits.Int4Settings(args.int4_block_size, args.int4_head_bits, args.int4_symmetric),
    )
    try:
        convert(
            args.path,
            args.out / name,
            name=name,
            options=options,
            variants=_variant_list(args.variants),
            device=gpu_gate.resolve_device(args.device),
        )
    except ConversionError as e:
        log.error("cannot convert: %s", e)
        return 2
    except parity.ParityError as e:
        log.error("%s", e)
        return 1
    log.info("wrote %s", args.out / name)
    return 0
