"""Translation throughput, side by side in one run; JSON to stdout.

Sentences/s of greedy translation of English test sentences (Tatoeba, the shared corpus):
the service's TranslationModel (encoder once per batch, decoder with self-attention KV cache and
reused cross K/V, finished rows leave the batch; concurrent calls of `--per-call` sentences,
batched by its queue task up to translate_max_batch) vs PyTorch greedy on the same weights
(export.seq2seq.Translator, batches of the same size): with its KV cache (the strong baseline,
`ratio`) and the model's own `greedy_decode` reference without a cache (`ratio_vs_reference`).
Target >= 2x. Both decode at most `--max-length` tokens per sentence.

Weights: the trained checkpoint (checkpoints/tatoeba-en-fr) when present, else a randomly
initialised Seq2SeqConfig() model with a joint BPE tokenizer trained here on Tatoeba; random
weights rarely emit EOS, so every sentence then runs the full max_length (said in the output).

    python -m bench.translate_throughput [--checkpoint DIR] [--sentences 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from export import data
from export.build import build_translation
from export.checkpoint import load_checkpoint
from export.seq2seq import Seq2SeqConfig, Translator
from export.tokenizer_train import TRANSLATOR_SPECIAL_TOKENS, train_translator_tokenizer
from service.manifest import load_model_dir
from service.runtime import Runtime
from service.settings import Settings
from service.textgen.translator import TranslateOptions, TranslationModel

log = logging.getLogger("bench.translate")

DEFAULT_CHECKPOINT = Path("checkpoints/tatoeba-en-fr")


def build_model(checkpoint: Path, out: Path, split: data.TatoebaSplit) -> tuple[Translator, str]:
    if (checkpoint / "config.json").is_file():
        model, meta = load_checkpoint(checkpoint)
        tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        special, source = meta["special_tokens"], f"trained checkpoint {checkpoint}"
    else:
        texts = [t for en, fr in split.train[:40000] for t in (en, fr)]
        tokenizer = train_translator_tokenizer(texts, Seq2SeqConfig().vocab_size)
        torch.manual_seed(0)
        model = Translator(Seq2SeqConfig(vocab_size=tokenizer.get_vocab_size(), dropout=0.0)).eval()
        special, source = TRANSLATOR_SPECIAL_TOKENS, "random init, Seq2SeqConfig() size (no trained checkpoint yet)"
    cfg = model.config
    build_translation(model.eval(), tokenizer, out / "bench-translate", name="bench-translate", special_tokens=special,
                      max_input_tokens=cfg.max_positions, max_output_tokens=cfg.max_positions - 1,
                      variants=("optimized",))
    return model, f"{source}; {model.num_parameters() / 1e6:.1f}M params"


@torch.no_grad()
def torch_greedy(model: Translator, batch: list[list[int]], max_length: int) -> list[list[int]]:
    """Batched greedy with the PyTorch KV cache (right-padded sources, rows run until all finish)."""
    cfg = model.config
    src, mask = data.pad(batch, cfg.pad_token_id)  # (B, S) each
    cross = model.encode(src, mask)
    B = src.shape[0]
    last = torch.full((B, 1), cfg.bos_token_id, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool)
    out, past = [], None
    for t in range(max_length):
        logits, past = model.decode(last, torch.ones(B, t + 1, dtype=torch.long), torch.full((B, 1), t), past, cross, mask)
        nxt = logits[:, -1].argmax(dim=-1)  # (B,)
        out.append(nxt)
        done |= nxt == cfg.eos_token_id
        if bool(done.all()):
            break
        last = nxt[:, None]  # (B, 1)
    return torch.stack(out, dim=1).tolist()


async def onnx_sps(model: TranslationModel, sentences: list[str], per_call: int, max_length: int) -> float:
    opts = TranslateOptions(max_length=max_length)
    start = time.perf_counter()
    calls = [model.translate(sentences[i : i + per_call], opts) for i in range(0, len(sentences), per_call)]
    await asyncio.gather(*calls)
    return len(sentences) / (time.perf_counter() - start)


def torch_sps(model: Translator, ids: list[list[int]], batch: int, max_length: int, cached: bool = True) -> float:
    """PyTorch greedy sentences/s: with the KV cache (`torch_greedy`) or the model's own
    `greedy_decode` reference, which re-decodes the whole prefix every step."""
    start = time.perf_counter()
    for i in range(0, len(ids), batch):
        if cached:
            torch_greedy(model, ids[i : i + batch], max_length)
        else:
            src, mask = data.pad(ids[i : i + batch], model.config.pad_token_id)  # (B, S) each
            model.greedy_decode(src, mask, max_length)
    return len(ids) / (time.perf_counter() - start)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.translate_throughput", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    p.add_argument("--sentences", type=int, default=128)
    p.add_argument("--per-call", type=int, default=8, help="sentences per Translate call (calls run concurrently)")
    p.add_argument("--batch", type=int, default=32, help="translate_max_batch, and the PyTorch batch size")
    p.add_argument("--max-length", type=int, default=48)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads = torch threads")
    p.add_argument("--rounds", type=int, default=2, help="alternating repetitions; the best of each is reported")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    split = data.split_tatoeba(data.load_tatoeba(data.DEFAULT_DATA["translator"]))
    sentences = sorted(en for en, _ in split.test[: args.sentences])
    with tempfile.TemporaryDirectory(prefix="bench-translate-") as tmp:
        model, source = build_model(args.checkpoint, Path(tmp), split)
        settings = Settings.from_env(env={}, models=tmp, intra_op_threads=args.threads, translate_max_batch=args.batch)
        runtime = Runtime(settings)
        engine = TranslationModel.load(load_model_dir(Path(tmp) / "bench-translate"), settings, runtime)
        await engine.start()
        await engine.warmup()
        ids = [engine.tokenizer.encode(s).ids for s in sentences]
        onnx, ref, nocache = [], [], []
        for _ in range(args.rounds):
            onnx.append(await onnx_sps(engine, sentences, args.per_call, args.max_length))
            ref.append(torch_sps(model, ids, args.batch, args.max_length))
            nocache.append(torch_sps(model, ids, args.batch, args.max_length, cached=False))
        await engine.stop()
        runtime.close()
    return {"weights": source, "threads": args.threads, "sentences": len(sentences), "max_length": args.max_length,
            "batch": args.batch, "onnx_sentences_per_s": round(max(onnx), 1),
            "torch_greedy_kv_cache_sentences_per_s": round(max(ref), 1), "ratio": round(max(onnx) / max(ref), 2),
            "torch_greedy_decode_reference_sentences_per_s": round(max(nocache), 1),
            "ratio_vs_reference": round(max(onnx) / max(nocache), 2), "target": 2.0,
            "rounds": {"onnx": [round(x, 1) for x in onnx], "torch_kv_cache": [round(x, 1) for x in ref],
                       "torch_reference": [round(x, 1) for x in nocache]},
            "note": "best of alternating rounds; the CPU is shared with a training job, figures are noisy"}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = asyncio.run(run(parse_args(sys.argv[1:] if argv is None else argv)))
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
