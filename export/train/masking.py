"""BERT's masking for masked-language-model training, as a pure function of its inputs and a generator.

Devlin et al., "BERT" (2019), section 3.1: 15 % of the (non-special) tokens of a sequence are
chosen; each chosen token is replaced by `[MASK]` 80 % of the time, by a random token 10 % and
left unchanged 10 %; the model predicts the original at the chosen positions only (labels -100
elsewhere, cross-entropy's ignore_index). As in BERT's `create_pretraining_data.py`, a row gets
exactly round(15 % x its eligible tokens) (at least one) chosen, not a Bernoulli draw per token.

Whole-word masking (BERT's 2019 release): a word's WordPiece continuations (`##...`) are chosen
together with its first piece; words are taken in a random order until the row's quota is
reached (the last word may overshoot it by its length - 1), then the 80/10/10 rule applies per
token, as in Hugging Face's DataCollatorForWholeWordMask.
"""

from __future__ import annotations

import torch

IGNORE = -100  # label of a position the loss ignores


def _choose(eligible: torch.Tensor, word_ids: torch.Tensor, prob: float, gen: torch.Generator) -> torch.Tensor:
    """-> (B, T) bool: per row, whole words (token groups sharing a word id) in random order until
    round(prob x eligible tokens) tokens are covered."""
    B, T = eligible.shape
    quota = (eligible.sum(1).float() * prob).round().clamp(min=1).long()  # (B,)
    score = torch.rand((B, T), generator=gen)  # one score per word: read at its first token
    score = torch.gather(score, 1, word_ids)  # (B, T) every piece of a word shares its score
    score = score.masked_fill(~eligible, 2.0)  # never chosen: sorted after every eligible token
    order = torch.argsort(score, dim=1, stable=True)  # a word's pieces stay contiguous
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(T).expand(B, T))  # (B, T) place in order
    first = torch.full((B, T), T, dtype=torch.long).scatter_reduce(1, word_ids, rank, reduce="amin")  # per word
    return (torch.gather(first, 1, word_ids) < quota[:, None]) & eligible


def mask_tokens(
    ids: torch.Tensor,
    special: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    first_normal_id: int,
    gen: torch.Generator,
    prob: float = 0.15,
    word_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (B, T) int64; special (B, T) bool: True at [CLS] [SEP] [PAD] (never chosen).

    word_starts (B, T) bool, optional: whole-word masking, True at a word's first piece (a
    continuation piece belongs to the word before it). Random replacements are drawn from
    [first_normal_id, vocab_size), so they are never special tokens.
    -> (inputs (B, T), labels (B, T): the original id where chosen, IGNORE elsewhere)."""
    B, T = ids.shape
    eligible = ~special
    positions = torch.arange(T).expand(B, T)
    if word_starts is None:
        word_ids = positions  # every token its own word
    else:  # a word is named by the position of its first piece; specials start (and end) words
        word_ids = torch.cummax(torch.where(word_starts | special, positions, 0), dim=1).values  # (B, T)
    chosen = _choose(eligible, word_ids, prob, gen)
    action = torch.rand((B, T), generator=gen)
    to_mask = chosen & (action < 0.8)
    to_random = chosen & (action >= 0.8) & (action < 0.9)
    random_ids = torch.randint(first_normal_id, vocab_size, (B, T), generator=gen)
    inputs = torch.where(to_mask, mask_id, torch.where(to_random, random_ids, ids))
    labels = torch.where(chosen, ids, IGNORE)
    return inputs, labels


def mask_all_chosen(
    ids: torch.Tensor, special: torch.Tensor, *, mask_id: int, gen: torch.Generator, prob: float = 0.15
) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluation masking: the same 15 % choice, every chosen token replaced by [MASK] (what a
    fill-mask request looks like). -> (inputs, labels)."""
    B, T = ids.shape
    chosen = _choose(~special, torch.arange(T).expand(B, T), prob, gen)
    return torch.where(chosen, mask_id, ids), torch.where(chosen, ids, IGNORE)
