"""BERT masking (export/train/masking.py): 15 % chosen, 80/10/10, specials never chosen, whole words kept together."""

from __future__ import annotations

import pytest
import torch

from export.train.masking import IGNORE, mask_all_chosen, mask_tokens

B, T, V, MASK, FIRST = 4000, 128, 8000, 4, 5  # 512,000 positions: ~70,000 chosen


def _sample(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(FIRST, V, (B, T), generator=gen)
    lengths = torch.randint(8, T + 1, (B,), generator=gen)
    pad = torch.arange(T)[None, :] >= lengths[:, None]  # right padding
    special = pad.clone()
    special[:, 0] = True  # [CLS]
    special[torch.arange(B), lengths - 1] = True  # [SEP]
    return ids, special


def _mask(ids, special, seed=1, word_starts=None):
    return mask_tokens(
        ids,
        special,
        mask_id=MASK,
        vocab_size=V,
        first_normal_id=FIRST,
        gen=torch.Generator().manual_seed(seed),
        word_starts=word_starts,
    )


@pytest.mark.parametrize("whole_word", [False, True])
def test_fifteen_percent_chosen_then_80_10_10(whole_word):
    ids, special = _sample()
    starts = torch.rand(B, T, generator=torch.Generator().manual_seed(2)) < 0.7 if whole_word else None
    inputs, labels = _mask(ids, special, word_starts=starts)
    chosen = labels != IGNORE
    share = chosen.sum().item() / (~special).sum().item()
    if whole_word:  # each row's last word may overshoot its quota by that word's length - 1
        assert 0.15 <= share < 0.16, share
    else:
        assert abs(share - 0.15) < 0.002, share
    assert not (chosen & special).any(), "a special token was chosen"
    assert torch.equal(labels[chosen], ids[chosen]) and (labels[~chosen] == IGNORE).all()
    assert torch.equal(inputs[~chosen], ids[~chosen]), "an unchosen token changed"
    got, n = inputs[chosen], chosen.sum().item()
    masked = (got == MASK).sum().item() / n
    unchanged = (got == ids[chosen]).sum().item() / n  # includes random draws of the same token (1/V)
    replaced = ((got != MASK) & (got != ids[chosen])).sum().item() / n
    assert abs(masked - 0.80) < 0.01 and abs(unchanged - 0.10) < 0.01 and abs(replaced - 0.10) < 0.01
    assert (got[got != MASK] >= FIRST).all(), "a random replacement was a special token"


def test_each_row_gets_its_quota():
    ids, special = _sample()
    _, labels = _mask(ids, special)
    eligible = (~special).sum(1).float()
    assert torch.equal((labels != IGNORE).sum(1), (eligible * 0.15).round().clamp(min=1).long())


def test_whole_word_masking_takes_every_piece_of_a_word():
    ids, special = _sample()
    starts = torch.rand(B, T, generator=torch.Generator().manual_seed(3)) < 0.6
    _, labels = _mask(ids, special, word_starts=starts)
    chosen = labels != IGNORE
    continuation = ~starts & ~special & ~torch.roll(special, 1, dims=1)  # a "##" piece inside a word
    previous = torch.roll(chosen, 1, dims=1)
    assert torch.equal(chosen[continuation], previous[continuation])
    assert continuation.sum() > 50_000


def test_same_generator_seed_same_masking():
    ids, special = _sample()
    a, b = _mask(ids[:64], special[:64], seed=7), _mask(ids[:64], special[:64], seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[1], _mask(ids[:64], special[:64], seed=8)[1])


def test_evaluation_masking_masks_every_chosen_token():
    ids, special = _sample()
    inputs, labels = mask_all_chosen(ids, special, mask_id=MASK, gen=torch.Generator().manual_seed(0))
    chosen = labels != IGNORE
    assert (inputs[chosen] == MASK).all() and torch.equal(inputs[~chosen], ids[~chosen])
    assert abs(chosen.sum().item() / (~special).sum().item() - 0.15) < 0.002
