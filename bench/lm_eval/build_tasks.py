"""Builds the lm-eval task data in bench/lm_eval/tasks/data/ from the generator's held-out stories.

The stories are checkpoints/tinystories-gpt/heldout.jsonl (TinyStories, held out of training; licence
and attribution in tasks/README.md). Deterministic (seed 0), so the committed files can be rebuilt:

    python -m bench.lm_eval.build_tasks

- perplexity.jsonl: each story as one document (`text`), for a loglikelihood_rolling task;
- next_sentence.jsonl: a story's beginning (`context`), its true next sentence and three sentences of
  other stories of about the same length (`choices`, `gold`): a multiple-choice task in the style of
  StoryCloze / HellaSwag.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORIES = ROOT / "checkpoints" / "tinystories-gpt" / "heldout.jsonl"
DATA = Path(__file__).resolve().parent / "tasks" / "data"
QUOTES = "\"'\u201c\u201d\u2018\u2019"  # straight and curly
SENTENCE = re.compile('[^.!?]+[.!?]+["\u201d\u2019]?')  # a sentence with its closing punctuation and quote
ITEMS_PER_STORY = 3
DISTRACTORS = 3


def sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in SENTENCE.findall(paragraph) if s.strip()]


def plain(sentence: str) -> bool:
    """No quotation marks: a quote's punctuation would tell the true sentence from the others."""
    return not set(sentence) & set(QUOTES)


def cut_points(text: str) -> list[tuple[str, str]]:
    """(context, next sentence) pairs where the sentence follows the context after one space."""
    out = []
    for end, paragraph in _paragraphs(text):
        parts = sentences(paragraph)
        for i in range(1, len(parts)):
            head = paragraph[: paragraph.index(parts[i])].rstrip()
            if paragraph[len(head) :].startswith(" " + parts[i]):
                out.append((text[:end] + head, parts[i]))
    return [(c, s) for c, s in out if len(c) >= 80 and plain(s)]  # some story to go on


def _paragraphs(text: str) -> list[tuple[int, str]]:
    """(start offset, paragraph) of each line of the story."""
    out, start = [], 0
    for line in text.split("\n"):
        out.append((start, line))
        start += len(line) + 1
    return out


def next_sentence_items(stories: list[str], rng: random.Random) -> list[dict]:
    pool = [
        (i, s) for i, story in enumerate(stories) for line in story.split("\n") for s in sentences(line) if plain(s)
    ]
    items = []
    for i, story in enumerate(stories):
        cuts = cut_points(story)
        for context, truth in rng.sample(cuts, min(ITEMS_PER_STORY, len(cuts))):
            others = [s for j, s in pool if j != i and s != truth]
            others.sort(key=lambda s: (abs(len(s) - len(truth)), s))
            choices = rng.sample(others[:20], DISTRACTORS)
            gold = rng.randrange(DISTRACTORS + 1)
            choices.insert(gold, truth)
            items.append({"context": context, "choices": choices, "gold": gold})
    return items


def main() -> None:
    stories = [json.loads(line)["text"] for line in STORIES.read_text(encoding="utf-8").splitlines()]
    rng = random.Random(0)
    DATA.mkdir(parents=True, exist_ok=True)
    with open(DATA / "perplexity.jsonl", "w", encoding="utf-8") as f:
        for story in stories:
            f.write(json.dumps({"text": story}, ensure_ascii=False) + "\n")
    items = next_sentence_items(stories, rng)
    with open(DATA / "next_sentence.jsonl", "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"{len(stories)} stories, {len(items)} next-sentence items -> {DATA}")


if __name__ == "__main__":
    main()
