"""Reasoning text apart from content (service/generation/reasoning.py): the whole-reply split, and a
stream's pieces (tags split anywhere across them) adding up to the same split."""

from __future__ import annotations

import pytest

from service.generation import reasoning

TEMPLATE = "{{ '<|im_start|>assistant\\n' }}{% if '</think>' in m %}{% endif %}"  # knows the tags
PLAIN = "{{ messages }}"  # a template without them: never reasoning


@pytest.mark.parametrize(
    ("template", "prompt", "reply", "expected"),
    [
        (TEMPLATE, "<|im_start|>assistant\n", "<think>\nLet me see.\n</think>\n\nBlue.", ("\nLet me see.\n", "Blue.")),
        (TEMPLATE, "<|im_start|>assistant\n", "Blue.", (None, "Blue.")),
        (TEMPLATE, "<|im_start|>assistant\n<think>\n", "Hmm, blue?</think>Blue.", ("Hmm, blue?", "Blue.")),
        (TEMPLATE, "<|im_start|>assistant\n<think>\n", "cut before the end", ("cut before the end", "")),
        (TEMPLATE, "x<think>\n\n</think>\n\n", "Blue.", (None, "Blue.")),  # enable_thinking false
        (PLAIN, "<|im_start|>assistant\n", "<think>a</think>b", (None, "<think>a</think>b")),
    ],
)
def test_a_reply_splits_into_reasoning_and_content(template, prompt, reply, expected):
    assert reasoning.split(template, prompt, reply) == expected


@pytest.mark.parametrize("reply", ["<think>\nLet me see.\n</think>\n\nBlue, 東京 🙂.", "Blue.", "<thi", "</think>x"])
@pytest.mark.parametrize("prompt", ["assistant\n", "assistant\n<think>\n"])
def test_streamed_pieces_add_up_to_the_whole_split(reply, prompt):
    whole = reasoning.split(TEMPLATE, prompt, reply)
    for size in (1, 2, 3, 5):
        splitter = reasoning.Splitter(TEMPLATE, prompt)
        thought = said = ""
        for at in range(0, len(reply), size):
            r, c = splitter.feed(reply[at : at + size])
            thought, said = thought + r, said + c
        r, c = splitter.finish()
        thought, said = thought + r, said + c
        assert (thought or None, said) == (whole[0] or None, whole[1]), size
