"""Training CLI: `python -m export train generator|translator|mlm [--time-budget-minutes M] ...`.

AdamW with linear warm-up then cosine decay, gradient clipping, label smoothing (translator),
periodic held-out evaluation, checkpoint + exact resume (weights, AdamW moments, schedule, step,
data cursor, RNG states in RUN_DIR/state.pt), fixed seeds, CUDA when available; `--bf16` runs
forward and backward under bfloat16 autocast (docs/training.md). `--time-budget-minutes` re-estimates
the total step count from the measured seconds per step so the cosine schedule ends annealed on
time; the final count is stored and `--steps N` replays it. At every evaluation the exportable
checkpoint (export/train/checkpoint.py) is written to --out, so a usable model exists early.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from export.models.decoder import DecoderConfig, GPTDecoder
from export.models.seq2seq import Seq2SeqConfig, Translator
from export.train import data, evaluate, tokenizer_train
from export.train.checkpoint import load_training_state, save_checkpoint, save_training_state
from export.train.heldout import HELDOUT_FILE, write_heldout
from export.train.mlm_train import MLMTask
from export.train.tokenizer_train import load_or_train_tokenizer

log = logging.getLogger(__name__)


def lr_at(step: int, sched: dict) -> float:
    """Linear warm-up to the peak, then cosine decay to min_ratio x peak at sched['total']."""
    peak, warmup, total = sched["peak"], sched["warmup"], sched["total"]
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (sched["min_ratio"] + (1 - sched["min_ratio"]) * 0.5 * (1 + math.cos(math.pi * progress)))


class TranslatorTask:
    """English -> French on the grouped Tatoeba split; batches of ~max_tokens padded tokens."""

    kind = "translator"

    def __init__(self, args, run_dir: Path):
        self.args = args
        self.tok = load_or_train_tokenizer(self.kind, args, run_dir)
        split = data.split_tatoeba(
            data.load_tatoeba(args.data), seed=args.seed, n_test=args.split_test, n_dev=args.split_dev
        )
        src = [e.ids for e in self.tok.encode_batch([en for en, _ in split.train])]
        tgt = [e.ids for e in self.tok.encode_batch([fr for _, fr in split.train], add_special_tokens=False)]
        keep = [i for i in range(len(src)) if len(src[i]) <= args.max_len and len(tgt[i]) + 1 <= args.max_len]
        log.info(
            "translator: %d training pairs (%d dropped over %d tokens), %d dev / %d test sentences",
            len(keep),
            len(src) - len(keep),
            args.max_len,
            len(split.dev),
            len(split.test),
        )
        self.src, self.tgt = [src[i] for i in keep], [tgt[i] for i in keep]
        self.lengths = [max(len(s), len(t) + 1) for s, t in zip(self.src, self.tgt)]
        self.dev = split.dev[: args.dev_sentences]
        self.cfg = Seq2SeqConfig(
            vocab_size=self.tok.get_vocab_size(),
            d_model=args.d_model,
            n_encoder_layers=args.layers,
            n_decoder_layers=args.decoder_layers or args.layers,
            n_heads=args.heads,
            d_ff=args.d_ff,
            max_positions=max(256, args.max_len),
            dropout=args.dropout,
        )
        self.model = Translator(self.cfg)
        self.cursor = {"epoch": 0, "index": 0}
        self._epoch_batches: tuple[int, list[list[int]]] | None = None

    def next_batch(self, step: int) -> tuple[dict, int]:
        epoch = self.cursor["epoch"]
        if self._epoch_batches is None or self._epoch_batches[0] != epoch:
            self._epoch_batches = (epoch, data.token_batches(self.lengths, self.args.max_tokens, self.args.seed, epoch))
        batches = self._epoch_batches[1]
        idx = batches[self.cursor["index"]]
        self.cursor["index"] += 1
        if self.cursor["index"] >= len(batches):
            self.cursor = {"epoch": epoch + 1, "index": 0}
        c = self.cfg
        batch = data.translation_batch(
            [self.src[i] for i in idx], [self.tgt[i] for i in idx], c.pad_token_id, c.bos_token_id, c.eos_token_id
        )
        return batch, int((batch["labels"] != -100).sum())

    def loss(self, model, batch: dict) -> torch.Tensor:
        logits = model(batch["src_ids"], batch["src_mask"], batch["tgt_ids"], batch["tgt_mask"])  # (B, T, V)
        return F.cross_entropy(
            logits.flatten(0, 1),
            batch["labels"].flatten(),
            ignore_index=-100,
            label_smoothing=self.args.label_smoothing,
        )

    def evaluate(self, model) -> dict:
        scores, hyps = evaluate.evaluate_translator(model, self.tok, self.dev, max_len=self.args.max_len)
        log.info("dev sample: %s -> %s", self.dev[0][0], hyps[0])
        return {"dev_bleu": scores["bleu"], "dev_chrf": scores["chrf"]}

    def save(self, model, out: Path, training: dict) -> None:
        save_checkpoint(
            model,
            out,
            name=self.args.name or "tatoeba-en-fr",
            tokenizer_path=self.args.tok_path,
            special_tokens=tokenizer_train.TRANSLATOR_SPECIAL_TOKENS,
            max_length=self.args.max_len,
            training=training,
        )


class GeneratorTask:
    """Next-token prediction on random windows of the concatenated TinyStories training stories."""

    kind = "generator"

    def __init__(self, args, run_dir: Path):
        self.args = args
        self.tok = load_or_train_tokenizer(self.kind, args, run_dir)
        train, held = data.split_stories(data.load_stories(args.data), seed=args.seed)
        # encode() prepends <|endoftext|>; story_stream adds the separators itself.
        self.stream = data.story_stream([e.ids[1:] for e in self.tok.encode_batch(train)], 0)
        held_stream = data.story_stream([e.ids[1:] for e in self.tok.encode_batch(held)], 0)
        self.heldout = data.stream_windows(held_stream, args.context)
        log.info(
            "generator: %d training stories (%d tokens), %d held out (%d tokens)",
            len(train),
            len(self.stream),
            len(held),
            len(held_stream),
        )
        self.cfg = DecoderConfig(
            vocab_size=self.tok.get_vocab_size(),
            d_model=args.d_model,
            n_layers=args.layers,
            n_heads=args.heads,
            d_ff=args.d_ff,
            max_positions=args.context,
            dropout=args.dropout,
        )
        self.model = GPTDecoder(self.cfg)
        self.cursor: dict = {}

    def next_batch(self, step: int) -> tuple[dict, int]:
        rows = max(1, self.args.max_tokens // self.args.context)
        x, y = data.stream_batch(self.stream, rows, self.args.context, self.args.seed, step)
        return {"input_ids": x, "labels": y}, y.numel()

    def loss(self, model, batch: dict) -> torch.Tensor:
        logits, _ = model(batch["input_ids"])  # (B, T, V)
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def evaluate(self, model) -> dict:
        ppl = evaluate.perplexity(model, self.heldout)
        sample = evaluate.sample_stories(model, self.tok, ["Once upon a time"], max_new_tokens=60)[0]
        log.info("sample: %s", sample.replace("\n", " "))
        return {"heldout_ppl": ppl["perplexity"]}

    def save(self, model, out: Path, training: dict) -> None:
        save_checkpoint(
            model,
            out,
            name=self.args.name or "tinystories-gpt",
            tokenizer_path=self.args.tok_path,
            special_tokens=tokenizer_train.GENERATOR_SPECIAL_TOKENS,
            max_length=self.args.context,
            training=training,
        )


def move(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def make_optimizer(model, args) -> torch.optim.AdamW:
    """Weight decay on matrices (and the embeddings) only, not on biases and LayerNorms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98), eps=1e-9)


def replan(sched: dict, step: int, elapsed: float, budget_s: float) -> None:
    """Re-estimate the total step count from the measured seconds per step, until half-way."""
    if step == 0 or step > sched["total"] // 2:
        return
    sched["total"] = max(sched["warmup"] + 1, step + 1, int(step * budget_s / elapsed))


@dataclass
class Progress:
    """Where a run stands; saved in state.pt (all but `smooth`, the loss EMA shown on the bar)."""

    step: int = 0
    elapsed: float = 0.0  # seconds of this run, over all its sessions
    tokens: int = 0  # target tokens trained on
    metrics: dict = field(default_factory=dict)
    smooth: float | None = None


def checkpoint_meta(args, task, sched: dict, prog: Progress) -> dict:
    return {
        "command": "python -m export " + " ".join(args.argv),
        "data": os.path.relpath(args.data),
        "seed": args.seed,
        "split": {"test": args.split_test, "dev": args.split_dev, "generator_holdout": 0.05},
        "steps": prog.step,
        "planned_steps": sched["total"],
        "tokens_seen": prog.tokens,
        "wall_minutes": round(prog.elapsed / 60, 1),
        "threads": torch.get_num_threads(),
        "device": str(args.device_obj),
        "parameters": task.model.num_parameters(),
        "metrics": prog.metrics,
    }


def train_step(task, model, opt, sched: dict, prog: Progress, args) -> float:
    """One optimizer step at the scheduled learning rate; returns that lr."""
    model.train()
    lr = lr_at(prog.step, sched)
    for group in opt.param_groups:
        group["lr"] = lr
    batch, n_tok = task.next_batch(prog.step)
    with torch.autocast(args.device_obj.type, dtype=torch.bfloat16, enabled=args.bf16):
        loss = task.loss(model, move(batch, args.device_obj))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    opt.step()
    value = loss.item()
    prog.step, prog.tokens = prog.step + 1, prog.tokens + n_tok
    prog.smooth = value if prog.smooth is None else 0.98 * prog.smooth + 0.02 * value
    return lr


def evaluate_and_save(task, model, opt, sched: dict, prog: Progress, args, lr: float, logf) -> None:
    """Held-out evaluation, a log line, the resumable state and the exportable checkpoint."""
    prog.metrics = task.evaluate(model)
    record = {
        "step": prog.step,
        "total": sched["total"],
        "loss": None if prog.smooth is None else round(prog.smooth, 4),
        "lr": lr,
        "tokens": prog.tokens,
        "minutes": round(prog.elapsed / 60, 2),
        **prog.metrics,
    }
    logf.write(json.dumps(record) + "\n")
    logf.flush()
    log.info("eval %s", record)
    if args.time_budget_minutes:
        replan(sched, prog.step, prog.elapsed, args.time_budget_minutes * 60)
    extra = {"elapsed": prog.elapsed, "tokens": prog.tokens, "metrics": prog.metrics, "cursor": task.cursor}
    save_training_state(
        args.run_dir / "state.pt", model=model, optimizer=opt, scheduler_state=sched, step=prog.step, extra=extra
    )
    task.save(model, args.out, checkpoint_meta(args, task, sched, prog))
    if not (args.out / HELDOUT_FILE).is_file():  # the export gate's held-out sample, written once
        write_heldout(args.out)


def resume(task, model, opt, sched: dict, args) -> tuple[dict, Progress]:
    state_path = args.run_dir / "state.pt"
    if not (args.resume and state_path.exists()):
        return sched, Progress()
    state = load_training_state(state_path, model=model, optimizer=opt)
    extra = state["extra"]
    task.cursor = extra["cursor"]
    log.info("resumed from %s at step %d", state_path, state["step"])
    return state["schedule"], Progress(state["step"], extra["elapsed"], extra["tokens"], extra["metrics"])


def run(task, args) -> dict:
    model = task.model.to(args.device_obj)
    opt = make_optimizer(model, args)
    sched = {"peak": args.lr, "warmup": args.warmup, "total": args.steps, "min_ratio": args.min_lr_ratio}
    sched, prog = resume(task, model, opt, sched, args)
    budget_s = args.time_budget_minutes * 60 if args.time_budget_minutes else None
    if budget_s and prog.step:  # a resumed run may come with a new budget
        replan(sched, prog.step, prog.elapsed, budget_s)
    bar = tqdm(total=sched["total"], initial=prog.step, desc=task.kind, dynamic_ncols=True, mininterval=2.0)
    start, window = time.time() - prog.elapsed, (time.time(), prog.tokens)
    with open(args.run_dir / "log.jsonl", "a", encoding="utf-8") as logf:
        while prog.step < min(sched["total"], args.stop_at or sched["total"]):
            lr = train_step(task, model, opt, sched, prog, args)
            now = time.time()
            prog.elapsed = now - start
            if budget_s and prog.step == args.calibrate_steps:
                replan(sched, prog.step, prog.elapsed, budget_s)
            bar.total = sched["total"]
            bar.update(1)
            tok_s = (prog.tokens - window[1]) / max(1e-9, now - window[0])
            bar.set_postfix(loss=f"{prog.smooth:.3f}", tok_s=f"{tok_s:.0f}", lr=f"{lr:.2e}", refresh=False)
            if prog.step % args.eval_every == 0 or prog.step in (sched["total"], args.stop_at):
                evaluate_and_save(task, model, opt, sched, prog, args, lr, logf)
                window = (time.time(), prog.tokens)
    bar.close()
    return {"step": prog.step, "metrics": prog.metrics, "minutes": round((time.time() - start) / 60, 1)}


DEFAULTS = {  # kind -> model / batch defaults (the shipped models)
    "translator": dict(
        d_model=256,
        layers=4,
        decoder_layers=3,
        heads=4,
        d_ff=1024,
        dropout=0.1,
        vocab_size=6000,
        max_tokens=3000,
        lr=1e-3,
        warmup=400,
        label_smoothing=0.1,
        max_len=64,
        eval_every=400,
        out=Path("checkpoints/tatoeba-en-fr"),
    ),
    "generator": dict(
        d_model=256,
        layers=4,
        decoder_layers=0,
        heads=8,
        d_ff=1024,
        dropout=0.0,
        vocab_size=4096,
        max_tokens=4096,
        lr=1.5e-3,
        warmup=100,
        label_smoothing=0.0,
        max_len=0,
        eval_every=100,
        out=Path("checkpoints/tinystories-gpt"),
    ),
    "mlm": dict(
        d_model=128,
        layers=4,
        decoder_layers=0,
        heads=4,
        d_ff=512,
        dropout=0.0,
        vocab_size=8000,
        max_tokens=2048,
        lr=1e-3,
        warmup=100,
        label_smoothing=0.0,
        max_len=128,
        eval_every=400,
        out=Path("checkpoints/mlm-encoder"),
    ),
}
TASKS: dict[str, type[TranslatorTask | GeneratorTask | MLMTask]] = {
    "translator": TranslatorTask,
    "generator": GeneratorTask,
    "mlm": MLMTask,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export train", description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=sorted(DEFAULTS))
    p.add_argument("--data", type=Path, help="corpus (default: ../shared/data/... for the kind)")
    p.add_argument("--out", type=Path, help="checkpoint directory written at every evaluation")
    p.add_argument("--run-dir", type=Path, help="state.pt, log.jsonl, tokenizer.json (default runs/<kind>)")
    p.add_argument("--name", help="model name in config.json")
    p.add_argument("--tokenizer", type=Path, help="use this tokenizer.json instead of training one")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/state.pt")
    p.add_argument("--steps", type=int, default=20000, help="total steps (the budget re-plans it)")
    p.add_argument("--time-budget-minutes", type=float, help="shape the cosine schedule to this wall time")
    p.add_argument("--calibrate-steps", type=int, default=50, help="steps timed before the first re-plan")
    p.add_argument("--eval-every", type=int, help="steps between evaluations (400 / 100)")
    p.add_argument("--dev-sentences", type=int, default=400, help="translator: dev sentences scored per eval")
    p.add_argument("--split-test", type=int, default=2000, help="translator: English sentences held out for test")
    p.add_argument("--split-dev", type=int, default=1000, help="translator: English sentences held out for dev")
    p.add_argument("--stop-at", type=int, help="stop at this step (after saving state); --resume continues")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: every CPU thread)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast for the training steps (weights stay fp32)")
    ints = ("d_model", "layers", "decoder_layers", "heads", "d_ff", "vocab_size", "max_tokens", "warmup", "max_len")
    for name in ints:
        p.add_argument("--" + name.replace("_", "-"), type=int)
    for name in ("dropout", "lr", "label_smoothing"):
        p.add_argument("--" + name.replace("_", "-"), type=float)
    p.add_argument("--context", type=int, default=256, help="generator: training context length")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--min-lr-ratio", type=float, default=0.02)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--sop", action="store_true", help="mlm: add sentence-order prediction (ALBERT) to the loss")
    p.add_argument("--whole-word", action="store_true", help="mlm: whole-word masking (WordPiece ## pieces together)")
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.kind].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.data = args.data or data.DEFAULT_DATA[args.kind]
    args.run_dir = args.run_dir or Path("runs") / args.kind
    return args


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv[1:])
    args.argv = argv
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    args.device_obj = torch.device("cuda" if use_cuda else "cpu")
    args.run_dir.mkdir(parents=True, exist_ok=True)
    task = TASKS[args.kind](args, args.run_dir)
    args.tok_path = args.tokenizer or args.run_dir / "tokenizer.json"
    log.info(
        "%s: %d parameters, %d threads, device %s",
        args.kind,
        task.model.num_parameters(),
        torch.get_num_threads(),
        args.device_obj,
    )
    result = run(task, args)
    log.info("done: %s", result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
