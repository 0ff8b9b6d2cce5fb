"""End-to-end FillMask throughput: the service at 1 and many clients vs PyTorch in-process, side by side.

1. Makes one input per sentence (its first 40 words) by replacing its middle word with `[MASK]`.
2. Starts `python -m service` on --models; `--clients` concurrent clients (grpc.aio) each send
   single-input FillMask calls (top_k 5) until the inputs run out, once per client count;
   inputs/s = inputs / wall time (after a warm-up round). Concurrent calls share batches.
3. Stops the service, then runs the checkpoint's MaskedLM in PyTorch on the same inputs (batches
   of --torch-batch-size, right-padded; softmax and top-5 at the masks) and reports the share of
   masks whose best token is the same on both sides.
Prints one JSON object with the machine's load (bench/common.py). Noisy on a shared machine:
compare the sides of one run, not runs across machines.

    python -m bench.fill_mask_throughput --models models --checkpoint checkpoints/mlm-encoder --clients 1 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

import grpc

from bench.common import ServiceProcess, conditions
from bench.embed_throughput import load_sentences
from client import fill_mask_request
from service.proto import inference_pb2_grpc as pb_grpc

log = logging.getLogger("bench.fill_mask_throughput")
TOP_K = 5
MAX_WORDS = 40  # stays within a small model's max_input_tokens (fill-mask refuses longer inputs)


def masked_inputs(sentences: list[str]) -> list[str]:
    """Each sentence (its first MAX_WORDS words) with its middle word replaced by [MASK]; one-word ones skipped."""
    out = []
    for sentence in sentences:
        words = sentence.split()[:MAX_WORDS]
        if len(words) >= 2:
            words[len(words) // 2] = "[MASK]"
            out.append(" ".join(words))
    return out


async def run_clients(address: str, inputs: list[str], clients: int, model: str) -> tuple[float, list[int]]:
    """Wall seconds for all inputs sent one per call by `clients` concurrent clients; best token ids."""
    best: list[int] = [-1] * len(inputs)
    queue: asyncio.Queue = asyncio.Queue()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.FillMaskServiceStub(channel)

        async def client() -> None:
            while not queue.empty():
                i, text = queue.get_nowait()
                response = await stub.FillMask(fill_mask_request([text], model=model, top_k=TOP_K), timeout=120)
                best[i] = response.results[0].masks[0].candidates[0].token_id

        for item in enumerate(inputs[: clients * 4]):  # warm-up round
            queue.put_nowait(item)
        await asyncio.gather(*(client() for _ in range(clients)))
        start = time.perf_counter()
        for item in enumerate(inputs):
            queue.put_nowait(item)
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - start, best


def pytorch_run(checkpoint: Path, inputs: list[str], batch_size: int, threads: int) -> tuple[float, list[int]]:
    """Wall seconds of the MaskedLM on the inputs (after a warm-up batch) and each mask's best token id."""
    import torch
    from tokenizers import Tokenizer

    from export.train.checkpoint import load_checkpoint

    if threads:
        torch.set_num_threads(threads)
    model, meta = load_checkpoint(checkpoint)
    model.eval()
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    pad, mask = meta["special_tokens"]["pad"], meta["special_tokens"]["mask"]
    rows = [enc.ids for enc in tok.encode_batch(inputs)]

    def run(batch: list[list[int]]) -> list[int]:
        width = max(len(r) for r in batch)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in batch])  # (B, T)
        attention = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in batch])[:, None]).long()  # (B, T)
        with torch.no_grad():
            logits = model(ids, attention)  # (B, T, V)
            probs = logits[ids == mask].softmax(-1)  # (M, V)
            return probs.topk(TOP_K, dim=-1).indices[:, 0].tolist()

    run(rows[:batch_size])
    start = time.perf_counter()
    best = [t for i in range(0, len(rows), batch_size) for t in run(rows[i : i + batch_size])]
    return time.perf_counter() - start, best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fill_mask_throughput", description=__doc__.splitlines()[0])
    p.add_argument("--models", type=Path, default=Path("models"), help="models root served (holds the fill-mask model)")
    p.add_argument("--model", default="", help="fill-mask model name (default: the server's default)")
    p.add_argument("--checkpoint", type=Path, default=None, help="its PyTorch checkpoint (reference side; optional)")
    p.add_argument("--data", type=Path, default=None, help="sentences file (default: as bench.embed_throughput)")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    p.add_argument("--torch-batch-size", type=int, default=8)
    p.add_argument("--torch-threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--server-flag", action="append", default=[], help="extra `python -m service` flag (repeatable)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    inputs = masked_inputs(load_sentences(args.data, args.sentences))
    flags = [f for flag in args.server_flag for f in flag.split()]
    result: dict = {
        "inputs": len(inputs),
        "top_k": TOP_K,
        "server_flags": flags,
        "conditions": conditions(),
        "service": {},
    }
    service = ServiceProcess(args.models, flags)
    try:
        for clients in args.clients:
            seconds, served = asyncio.run(run_clients(service.address, inputs, clients, args.model))
            result["service"][f"clients_{clients}"] = {
                "seconds": round(seconds, 3),
                "inputs_per_s": round(len(inputs) / seconds, 1),
            }
    finally:
        result["service"]["exit_code"] = service.stop()
    if args.checkpoint:
        seconds, reference = pytorch_run(args.checkpoint, inputs, args.torch_batch_size, args.torch_threads)
        result["pytorch"] = {
            "seconds": round(seconds, 3),
            "batch_size": args.torch_batch_size,
            "inputs_per_s": round(len(inputs) / seconds, 1),
        }
        result["top1_agreement"] = round(sum(a == b for a, b in zip(served, reference, strict=True)) / len(inputs), 4)
    sys.stdout.write(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
