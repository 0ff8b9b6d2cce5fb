"""The service on CUDA against PyTorch on the same GPU, with the shipped checkpoints' trained weights.

Random tiny models have near-tie logits, so kernel rounding flips their greedy tokens after a few
steps even when the code is right; trained weights give decisive logits, so here tokens must be
equal: the service's greedy tokens (fp32 graphs, and fp16 graphs over a shorter span) against the
PyTorch model on the GPU in the same precision, greedy translations against `greedy_decode`, and
the CUDA-graph path (`Settings.cuda_graph`, when this checkout has it) against the plain one.
Skipped without a CUDA GPU for both onnxruntime and PyTorch. Model directories are exported from
checkpoints/ through the real pipeline and cached like the other fixtures (tests/fixtures/models.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

from client import generate_request, translate_request
from service.proto import inference_pb2 as pb
from service.runtime import CUDA
from service.settings import Settings
from tests.fixtures.models import cached_build
from tests.paths import CHECKPOINTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(900),  # the first run exports both checkpoints through the gate (cached after)
    pytest.mark.skipif(
        CUDA not in ort.get_available_providers() or not torch.cuda.is_available(),
        reason="needs onnxruntime-gpu and a CUDA GPU for PyTorch",
    ),
]
GPT, TRANSLATOR = "tinystories-gpt", "tatoeba-en-fr"
PROMPTS = [
    "Once upon a time",
    "One day, a little girl named Lily",
    "Tom had a big red ball.",
    "The sun was hot and",
    "There was a cat",
    "Sam and his mom went to the park",
    "A bird sat on a tree",
    "Mia wanted a cookie",
]
SOURCES = ["I like green apples.", "Where is the station?", "Tom is reading a book in the garden.", "Thank you!"]
VARIANTS = ("optimized", "fp16")


@pytest.fixture(scope="module")
def root() -> Path:
    from export.modeldir import source_hash
    from export.train.checkpoint import build_checkpoint

    files = sorted(p for name in (GPT, TRANSLATOR) for p in (CHECKPOINTS / name).iterdir() if p.is_file())
    key = "checkpoints-" + source_hash(files, salt=repr(VARIANTS))[:16]

    def build(tmp: Path) -> None:
        for name in (GPT, TRANSLATOR):
            build_checkpoint(CHECKPOINTS / name, tmp / name, VARIANTS)

    return cached_build(key, [GPT, TRANSLATOR], build)


def _model(name: str, dtype: torch.dtype):
    from export.train.checkpoint import load_checkpoint

    model, _ = load_checkpoint(CHECKPOINTS / name)
    return model.to("cuda", dtype)


def _trim(tokens: list[int], eos: int) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens


def pytorch_greedy(root: Path, dtype: torch.dtype, new_tokens: int) -> list[list[int]]:
    """`GPTDecoder.generate` on the GPU (the gate's reference), stopping at EOS as the service does."""
    model, tok = _model(GPT, dtype), Tokenizer.from_file(str(root / GPT / "tokenizer.json"))
    out = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt).ids  # with the leading <|endoftext|>, as the service tokenizes
        tokens = model.generate(torch.tensor([ids], device="cuda"), new_tokens)[0, len(ids) :].tolist()
        out.append(_trim(tokens, model.config.eos_token_id))
    return out


async def served_greedy(server, new_tokens: int, together: bool = False) -> list[list[int]]:
    async def one(prompt: str) -> list[int]:
        response = await server.generation.Generate(generate_request(prompt, max_new_tokens=new_tokens), timeout=120)
        return list(response.token_ids)

    if together:
        return list(await asyncio.gather(*(one(p) for p in PROMPTS)))
    return [await one(p) for p in PROMPTS]


async def _on_cuda(start_server, root: Path, strict: bool = True, **settings):
    """strict False for fp32: the fp32 decoder's attention runs on the CPU (fp16/bf16-only CUDA kernel)."""
    server = await start_server(root, device="cuda", strict_provider=strict, gen_max_batch=len(PROMPTS), **settings)
    for name in (GPT, TRANSLATOR):
        assert (await server.models.GetModel(pb.GetModelRequest(name=name))).execution_provider == CUDA
    return server


@pytest.mark.parametrize(
    ("variant", "dtype", "new_tokens"), [("optimized", torch.float32, 96), ("fp16", torch.float16, 32)]
)
async def test_service_greedy_tokens_equal_pytorch_on_the_same_gpu(start_server, root, variant, dtype, new_tokens):
    server = await _on_cuda(start_server, root, strict=variant == "fp16", variant=variant)
    eos = Tokenizer.from_file(str(root / GPT / "tokenizer.json")).token_to_id("<|endoftext|>")
    alone = [_trim(t, eos) for t in await served_greedy(server, new_tokens)]
    assert alone == pytorch_greedy(root, dtype, new_tokens)
    assert [_trim(t, eos) for t in await served_greedy(server, new_tokens, together=True)] == alone


async def test_service_translations_equal_pytorch_greedy_on_the_same_gpu(start_server, root):
    server = await _on_cuda(start_server, root, strict=False, variant="optimized")
    response = await server.translation.Translate(translate_request(SOURCES, max_length=48), timeout=120)
    model, tok = _model(TRANSLATOR, torch.float32), Tokenizer.from_file(str(root / TRANSLATOR / "tokenizer.json"))
    expected = []
    for source in SOURCES:
        ids = torch.tensor([tok.encode(source).ids], device="cuda")  # (1, S), ends with </s>
        expected.append(tok.decode(model.greedy_decode(ids, torch.ones_like(ids), 48)[0], skip_special_tokens=True))
    assert [t.text for t in response.translations] == expected


async def test_cuda_graphs_give_the_plain_paths_tokens(start_server, root):
    if "cuda_graph" not in {f.name for f in dataclasses.fields(Settings)}:
        pytest.skip("this checkout's Settings has no cuda_graph field")
    plain = await _on_cuda(start_server, root, variant="fp16", cuda_graph=False)
    graphs = await _on_cuda(start_server, root, variant="fp16", cuda_graph=True)
    for together in (False, True):  # one row, then every row count up to len(PROMPTS) as streams end
        assert await served_greedy(graphs, 64, together) == await served_greedy(plain, 64, together)
