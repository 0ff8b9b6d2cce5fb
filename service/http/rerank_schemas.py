"""JSON <-> the classification core's values, in the shapes rerank and classify clients already send.

- TEI `POST /rerank`: {query, texts, raw_scores, return_text, truncate} -> [{index, score, text?}], best first.
- Cohere / Jina `POST /v1/rerank`, `/v2/rerank`: {model, query, documents (strings or {text}), top_n,
  return_documents} -> {id, model, results: [{index, relevance_score, document?: {text}}], usage};
  documents come back by default on v1 (Cohere v1, Jina), not on v2 (Cohere v2).
- vLLM `POST /v1/score`: {model, text_1, text_2} (one and N, or N and N) -> {data: [{index, score}], usage}.
- TEI `POST /predict`: {inputs: a text, a pair [a, b], or a list of either, raw_scores, truncate} ->
  every label {label, score} best first (a list of those per input for a list).
- `POST /classify` (infinity's shape): {model, input: a text or texts, raw_scores} -> {data: [[{label, score}]]}.

Types are checked here (schemas.field), and arrays' lengths before any element is (`Most`: the
core's limits, rerank_max_documents and classify_max_inputs); ranges and every other rule are the core's.
"""

from __future__ import annotations

import time
import uuid

from service.classification.core import Classified, ClassifyQuery, RerankQuery, Scored, ScoreQuery
from service.classification.tokenization import Input
from service.errors import InvalidArgument
from service.http.schemas import count, field, strings, text

MAX_TOP_N = 2**31 - 1
Most = tuple[int, str]  # (the limit on an array's length, its setting): checked before any element is


def _usage(tokens: int) -> dict:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def tei_rerank(body: dict, most: Most) -> tuple[RerankQuery, bool]:
    """(the core's query, return_text)."""
    query = RerankQuery(
        query=field(body, "query", str, ""),
        documents=strings(body, "texts", [], most=most),
        model=field(body, "model", str, ""),
        raw_scores=field(body, "raw_scores", bool, False),
        truncate=field(body, "truncate", bool, True),
    )
    return query, field(body, "return_text", bool, False)


def tei_ranked(answer: Scored, query: RerankQuery, return_text: bool) -> list[dict]:
    return [
        {"index": i, "score": s, **({"text": query.documents[i]} if return_text else {})}
        for i, s in zip(answer.indexes, answer.scores, strict=True)
    ]


def _documents(body: dict, most: Most) -> list[str]:
    value = body.get("documents")
    if not isinstance(value, list):
        raise InvalidArgument('documents must be an array of strings or of {"text": ...} objects')
    count("documents", value, *most)
    out = []
    for i, doc in enumerate(value):
        if isinstance(doc, dict) and isinstance(doc.get("text"), str):
            doc = doc["text"]
        if not isinstance(doc, str):
            raise InvalidArgument(f'documents[{i}] must be a string or an object with a "text" string')
        out.append(text(f"documents[{i}]", doc))
    return out


def cohere_rerank(body: dict, version: int, most: Most) -> tuple[RerankQuery, bool]:
    """(the core's query, return_documents); version 1 returns documents unless told not to, 2 only when asked."""
    query = RerankQuery(
        query=field(body, "query", str, ""),
        documents=_documents(body, most),
        model=field(body, "model", str, ""),
        top_n=field(body, "top_n", int, None, minimum=-MAX_TOP_N, maximum=MAX_TOP_N),
        raw_scores=field(body, "raw_scores", bool, False),
        truncate=field(body, "truncate", bool, True),
    )
    return query, field(body, "return_documents", bool, version == 1)


def cohere_ranked(answer: Scored, query: RerankQuery, return_documents: bool) -> dict:
    results = [
        {
            "index": i,
            "relevance_score": s,
            **({"document": {"text": query.documents[i]}} if return_documents else {}),
        }
        for i, s in zip(answer.indexes, answer.scores, strict=True)
    ]
    return {"id": str(uuid.uuid4()), "model": answer.model, "results": results, "usage": _usage(answer.input_tokens)}


def vllm_score(body: dict, most: Most) -> ScoreQuery:
    first, second = strings(body, "text_1", most=most), strings(body, "text_2", most=most)
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise InvalidArgument(
            f"text_1 has {len(first)} texts and text_2 {len(second)}: send one text_1 for any number of "
            "text_2, or as many of each"
        )
    return ScoreQuery(
        pairs=list(zip(first, second, strict=True)),
        model=field(body, "model", str, ""),
        truncate=field(body, "truncate", bool, True),
    )


def vllm_scores(answer: Scored) -> dict:
    return {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": answer.model,
        "data": [
            {"index": i, "object": "score", "score": s} for i, s in zip(answer.indexes, answer.scores, strict=True)
        ],
        "usage": _usage(answer.input_tokens),
    }


def _sequence(value, where: str) -> Input | None:
    """A text, or a pair [a, b]; None when value is neither."""
    if isinstance(value, str):
        return (text(where, value), None)
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return (text(f"{where}[0]", value[0]), text(f"{where}[1]", value[1]))
    return None


def tei_predict(body: dict, most: Most) -> tuple[ClassifyQuery, bool]:
    """(the core's query, batch?): TEI reads `inputs` as one text or pair first, else a list of them."""
    value = body.get("inputs")
    single = _sequence(value, "inputs")
    if single is not None:
        inputs = [single]
    elif isinstance(value, list) and value:
        count("inputs", value, *most)
        items = [_sequence(v, f"inputs[{i}]") for i, v in enumerate(value)]
        bad = next((i for i, x in enumerate(items) if x is None), None)
        if bad is not None:
            raise InvalidArgument(f"inputs[{bad}] must be a text or a pair of two texts [text, text_pair]")
        inputs = [x for x in items if x is not None]
    elif value == []:
        inputs = []
    else:
        raise InvalidArgument("inputs must be a text, a pair [text, text_pair], or a list of either")
    query = ClassifyQuery(
        inputs=inputs,
        model=field(body, "model", str, ""),
        raw_scores=field(body, "raw_scores", bool, False),
        truncate=field(body, "truncate", bool, True),
    )
    return query, single is None


def labelled(answer: Classified) -> list[list[dict]]:
    """Per input, every label with its score, best first."""
    out = []
    for row in answer.scores.tolist():
        order = sorted(range(len(row)), key=lambda i: -row[i])
        out.append([{"label": answer.labels[i], "score": row[i]} for i in order])
    return out


def classify_request(body: dict, most: Most) -> ClassifyQuery:
    return ClassifyQuery(
        inputs=[(t, None) for t in strings(body, "input", most=most)],
        model=field(body, "model", str, ""),
        raw_scores=field(body, "raw_scores", bool, False),
        truncate=field(body, "truncate", bool, True),
    )


def classify_response(answer: Classified) -> dict:
    return {
        "id": f"classify-{uuid.uuid4().hex}",
        "object": "classify",
        "created": int(time.time()),
        "model": answer.model,
        "data": labelled(answer),
        "usage": _usage(answer.input_tokens),
    }
