"""Reasoning text: what a model writes between `<think>` and `</think>` goes to `reasoning_content`,
the rest to `content` (Qwen3, QwQ, DeepSeek-R1 distills).

A chat reasons when its template knows the tags (`</think>` in its text) and the reply opens them:
either the rendered prompt ends inside an open `<think>` (DeepSeek-R1's template writes it into the
generation prompt) or the reply starts with `<think>`. Anything after `</think>` (new lines
stripped) is content; a reply cut before `</think>` is all reasoning. `Splitter.feed` does the same
on a stream's pieces, holding back a piece that could be the start of a tag split across chunks.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def opened_in(prompt: str) -> bool:
    """Whether the rendered prompt leaves a `<think>` open for the reply to continue."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


class Splitter:
    """One reply's text -> (reasoning, content) pieces, as they arrive."""

    def __init__(self, template_source: str, prompt: str):
        self.enabled = CLOSE in template_source
        self.state = "reasoning" if self.enabled and opened_in(prompt) else "start" if self.enabled else "content"
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        """New text -> (reasoning, content) it adds (either may be empty)."""
        text, self._held = self._held + text, ""
        reasoning = content = ""
        while text:
            if self.state == "content":
                return reasoning, content + text
            if self.state == "closed":  # the new lines after </think>, however they are split
                text = text.lstrip("\n")
                self.state = "content" if text else "closed"
                continue
            if self.state == "start":
                stripped = text.lstrip()
                if OPEN.startswith(stripped):  # too little to tell yet
                    self._held = text
                    return reasoning, content
                self.state = "reasoning" if stripped.startswith(OPEN) else "content"
                text = stripped[len(OPEN) :] if self.state == "reasoning" else text
                continue
            at = text.find(CLOSE)
            if at >= 0:
                reasoning += text[:at]
                text, self.state = text[at + len(CLOSE) :], "closed"
                continue
            keep = _partial_tag(text)
            reasoning, self._held = reasoning + text[: len(text) - keep], text[len(text) - keep :]
            return reasoning, content
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, once the reply has ended."""
        held, self._held = self._held, ""
        return (held, "") if self.state == "reasoning" else ("", held)


def split(template_source: str, prompt: str, text: str) -> tuple[str | None, str]:
    """A whole reply -> (reasoning or None when the chat does not reason, content)."""
    splitter = Splitter(template_source, prompt)
    reasoning, content = splitter.feed(text)
    more_reasoning, more_content = splitter.finish()
    reasoning, content = reasoning + more_reasoning, content + more_content
    if not splitter.enabled:
        return None, content
    return (reasoning if splitter.state == "reasoning" or reasoning or CLOSE in text else None), content


def _partial_tag(text: str) -> int:
    """Characters at the end of text that could begin `</think>`."""
    for n in range(min(len(CLOSE) - 1, len(text)), 0, -1):
        if CLOSE.startswith(text[-n:]):
            return n
    return 0
