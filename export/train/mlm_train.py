"""`python -m export train mlm`: the masked-language-model task for the shared training loop (export/train/loop.py).

Rows are packed chunks of the three shared corpora (export/train/mlm_data.py) written `[CLS] chunk
[SEP]`, masked with BERT's 80/10/10 rule (export/train/masking.py; `--whole-word` for whole-word
masking). The loss is cross-entropy at the chosen positions only; the MLM head runs on those rows
alone (15 % of the positions), which saves most of the vocabulary projection's cost.

`--sop` adds ALBERT's sentence-order prediction: each chunk is cut at a random point into two
segments A, B and fed as `[CLS] A [SEP] B [SEP]` (token types 0 / 1), swapped half of the time;
a two-way classifier on [CLS] predicts whether they are in order, and its cross-entropy is added
to the MLM loss. Serving uses single segments (token type 0), which SOP training also sees as A.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from export.models.encoder import EncoderConfig
from export.models.mlm import MaskedLM
from export.train import data, mlm_data, mlm_eval, tokenizer_train
from export.train.checkpoint import save_checkpoint
from export.train.heldout import HELDOUT_FILE
from export.train.masking import IGNORE, mask_tokens
from export.train.tokenizer_train import load_or_train_tokenizer

log = logging.getLogger(__name__)

SPECIAL = tokenizer_train.MLM_SPECIAL_TOKENS
N_SPECIAL = len(tokenizer_train.MLM_SPECIALS)
MIN_CHUNK = 16  # shorter packed chunks (a corpus's tail) are dropped


def mlm_loss(model: MaskedLM, batch: dict) -> torch.Tensor:
    """Cross-entropy at the chosen positions (+ the SOP cross-entropy when the batch has sop_labels)."""
    hidden = model.hidden(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"))  # (B, T, C)
    chosen = batch["labels"] != IGNORE
    logits = model.head(hidden[chosen], model.encoder.embeddings.word.weight)  # (N, V): chosen rows only
    loss = F.cross_entropy(logits, batch["labels"][chosen])
    if "sop_labels" in batch:
        loss = loss + F.cross_entropy(model.sop(hidden[:, 0]), batch["sop_labels"])
    return loss


class MLMTask:
    kind = "mlm"

    def __init__(self, args, run_dir: Path):
        self.args = args
        self.tok: Tokenizer = load_or_train_tokenizer(self.kind, args, run_dir)
        self.tok.no_truncation()
        train, held = mlm_data.split_passages(mlm_data.load_passages(args.data), seed=args.seed)
        width = args.max_len - 3  # room for [CLS] A [SEP] B [SEP]
        self.chunks = []
        for name, passages in train.items():
            ids = [e.ids[1:-1] for e in self.tok.encode_batch(passages)]
            chunks = [c for c in mlm_data.pack(ids, width) if len(c) >= MIN_CHUNK]
            log.info(
                "mlm: %s: %d training passages -> %d chunks (%d tokens), %d held out",
                name,
                len(passages),
                len(chunks),
                sum(map(len, chunks)),
                len(held[name]),
            )
            self.chunks += chunks
        vocab = self.tok.get_vocab_size()
        self.counts = mlm_eval.unigram_counts(self.chunks, vocab)
        self.log_unigram = mlm_eval.unigram_log_probs(self.counts, N_SPECIAL)
        self.heldout = [{"corpus": name, "text": p} for name, passages in held.items() for p in passages]
        self.eval_rows = mlm_eval.masked_rows(self.tok, [h["text"] for h in self.heldout], args.max_len, SPECIAL)
        continuation = [(self.tok.id_to_token(i) or "").startswith("##") for i in range(vocab)]
        self.continuation = torch.tensor(continuation)
        self.cfg = EncoderConfig(
            vocab_size=vocab,
            d_model=args.d_model,
            n_layers=args.layers,
            n_heads=args.heads,
            d_ff=args.d_ff,
            max_positions=args.max_len,
            max_length=args.max_len,
            pad_token_id=SPECIAL["pad"],
        )
        self.model = MaskedLM(self.cfg)
        self.cursor: dict = {}

    def _rows(self, idx: np.ndarray, gen: torch.Generator) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """-> ids, token types and SOP labels (1: swapped) of the chunks idx."""
        cls, sep = SPECIAL["cls"], SPECIAL["sep"]
        rows, types, order = [], [], []
        for i in idx:
            chunk = self.chunks[i]
            if not self.args.sop:
                rows.append([cls, *chunk, sep])
                types.append([0] * (len(chunk) + 2))
                continue
            cut = int(torch.randint(1, len(chunk), (1,), generator=gen))
            a, b = chunk[:cut], chunk[cut:]
            swapped = int(torch.rand((), generator=gen) < 0.5)
            a, b = (b, a) if swapped else (a, b)
            rows.append([cls, *a, sep, *b, sep])
            types.append([0] * (len(a) + 2) + [1] * (len(b) + 1))
            order.append(swapped)
        return rows, types, order

    def next_batch(self, step: int) -> tuple[dict, int]:
        gen = torch.Generator().manual_seed(self.args.seed * 1_000_003 + step)
        n_rows = max(1, self.args.max_tokens // self.args.max_len)
        rows, types, order = self._rows(mlm_data.batch_rows(len(self.chunks), n_rows, self.args.seed, step), gen)
        ids, mask = data.pad(rows, SPECIAL["pad"])
        token_types, _ = data.pad(types, 0)
        special = (ids == SPECIAL["cls"]) | (ids == SPECIAL["sep"]) | (mask == 0)
        starts = ~self.continuation[ids] if self.args.whole_word else None
        inputs, labels = mask_tokens(
            ids,
            special,
            mask_id=SPECIAL["mask"],
            vocab_size=self.cfg.vocab_size,
            first_normal_id=N_SPECIAL,
            gen=gen,
            word_starts=starts,
        )
        batch = {"input_ids": inputs, "attention_mask": mask, "token_type_ids": token_types, "labels": labels}
        if self.args.sop:
            batch["sop_labels"] = torch.tensor(order)
        return batch, int((labels != IGNORE).sum())

    def loss(self, model, batch: dict) -> torch.Tensor:
        return mlm_loss(model, batch)

    def evaluate(self, model) -> dict:
        figures = mlm_eval.evaluate(model, self.eval_rows, self.log_unigram)
        if self.args.sop:
            figures["heldout_sop_accuracy"] = self._sop_accuracy(model)
        return figures

    @torch.no_grad()
    def _sop_accuracy(self, model) -> float:
        """SOP accuracy on held-out passages cut in two (fixed seed)."""
        gen = torch.Generator().manual_seed(mlm_eval.EVAL_SEED)
        texts = [h["text"] for h in self.heldout[:: max(1, len(self.heldout) // 128)]]
        chunks = [e.ids[1 : self.args.max_len - 2] for e in self.tok.encode_batch(texts)]
        keep = [c for c in chunks if len(c) >= MIN_CHUNK]
        saved, self.chunks = self.chunks, keep
        try:
            rows, types, order = self._rows(np.arange(len(keep)), gen)
        finally:
            self.chunks = saved
        ids, mask = data.pad(rows, SPECIAL["pad"])
        token_types, _ = data.pad(types, 0)
        device = next(model.parameters()).device
        hidden = model.eval().hidden(ids.to(device), mask.to(device), token_types.to(device))
        predicted = model.sop(hidden[:, 0]).argmax(-1).cpu()
        return round(float((predicted == torch.tensor(order)).float().mean()), 4)

    def save(self, model, out: Path, training: dict) -> None:
        training = {
            **training,
            "objective": "mlm+sop" if self.args.sop else "mlm",
            "whole_word_masking": bool(self.args.whole_word),
            "corpora": list(mlm_data.FILES),
            "holdout": mlm_data.HOLDOUT,
        }
        save_checkpoint(
            model,
            out,
            name=self.args.name or "mlm-encoder",
            tokenizer_path=self.args.tok_path,
            special_tokens=SPECIAL,
            max_length=self.args.max_len,
            training=training,
        )
        if not (out / HELDOUT_FILE).is_file():
            (out / HELDOUT_FILE).write_text(
                "".join(json.dumps(h, ensure_ascii=False) + "\n" for h in self.heldout), encoding="utf-8"
            )
            mlm_eval.save_unigram(self.counts, out)
