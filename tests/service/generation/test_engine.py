"""Generation and translation engines on the tiny exported models against their PyTorch originals.

No server here: the models are driven directly (real onnxruntime sessions, the real scheduler and
batcher tasks), and compared with the seeded PyTorch models they were exported from.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from bench.prefill_logits import without_logits_positions
from export.tiny import tiny_model
from service.errors import Unavailable
from service.generation.decoding import SamplingParams
from service.generation.model import GenerationModel
from service.manifest import load_model_dir
from service.runtime import ProviderError, Runtime
from service.settings import Settings
from service.translation.engine import Seq2SeqBatch
from service.translation.model import TranslateOptions, TranslationModel
from service.translation.search import SourceSearch, log_softmax

PROMPTS = ["Once upon a time", "The cat", "A longer prompt of many byte tokens, é ü!", "Hi", "", "Tom and Sue"]
SOURCES = ["Hello world.", "The cat sleeps on the mat.", "Yes", "Where is the train station, please?"]


@pytest.fixture
async def runtime(tiny_models_root: Path):
    rt = Runtime(Settings.from_env(env={}, models=str(tiny_models_root), variant="fp32", gen_max_batch=4))
    yield rt
    rt.close()


async def load(cls, runtime: Runtime, root: Path, name: str, variant: str = "fp32", **kwargs):
    model_dir = load_model_dir(root / name)
    sessions = _sessions(cls, runtime, model_dir, variant)
    model = cls(model_dir.manifest, *sessions, runtime.settings, runtime, variant, **kwargs)
    await model.start()
    return model


def _sessions(cls, runtime: Runtime, model_dir, variant: str = "fp32") -> list:
    from tokenizers import Tokenizer

    m = model_dir.manifest
    tok = Tokenizer.from_file(str(model_dir.file(m.tokenizer["file"])))
    roles = ["decoder"] if cls is GenerationModel else ["encoder", "decoder"]
    return [runtime.create_session(model_dir.file(m.graph(r, variant).file)) for r in roles] + [tok]


async def generate(model: GenerationModel, prompt: str, **params) -> list[int]:
    handle = model.submit(prompt, SamplingParams(**params))
    return [t async for chunk in handle for t in chunk.token_ids]


async def test_greedy_matches_pytorch(runtime, tiny_models_root):
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    ref = tiny_model("generation", model.io.vocab_size)
    for prompt in PROMPTS[:3]:
        ids = model.tokenizer.encode(prompt).ids
        expected = ref.generate(torch.tensor([ids]), 20)[0, len(ids) :].tolist()
        assert await generate(model, prompt, max_new_tokens=20) == expected
    await model.stop()


@pytest.mark.parametrize("variant", ["fp32", "int8"])
async def test_concurrent_greedy_equals_alone_and_cache_is_compacted(runtime, tiny_models_root, variant):
    """More requests than batch rows (gen_max_batch=4), joining and leaving at different steps, so
    rows move down in the cache buffer. int8 too: its row-wise quantisation scales each row on
    its own, so a row's tokens cannot depend on its neighbours."""
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt", variant)
    lengths = [5, 30, 12, 25, 8, 17]
    alone = [await generate(model, p, max_new_tokens=n) for p, n in zip(PROMPTS, lengths, strict=True)]
    crowd = await asyncio.gather(*(generate(model, p, max_new_tokens=n) for p, n in zip(PROMPTS, lengths, strict=True)))
    assert list(crowd) == alone
    assert model.scheduler.idle and model.scheduler.cache.rows == 0 and model.scheduler.cache.tokens == 0
    await model.stop()


async def test_cache_buffer_is_updated_in_place(runtime, tiny_models_root):
    """The graph writes each step's keys into the bound buffer itself: the slots of a running row
    fill up one per step, with no new array handed back."""
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    cache = model.scheduler.cache
    prompt = model.tokenizer.encode("Once upon a time").ids
    first = cache.prefill([prompt])
    buffers = [v.data_ptr() for v in cache._kv]
    key = cache._kv[0].numpy()  # (capacity, H, L, D), read back after each call
    assert cache.rows == 1 and cache.lengths[0] == len(prompt)
    assert np.abs(key[0, :, : len(prompt)]).sum() > 0 and np.abs(key[0, :, len(prompt) :]).sum() == 0
    cache.step([int(first[0].argmax())])
    key = cache._kv[0].numpy()
    assert cache.lengths[0] == len(prompt) + 1 and np.abs(key[0, :, len(prompt)]).sum() > 0
    assert [v.data_ptr() for v in cache._kv] == buffers
    cache.reset()
    await model.stop()


async def test_io_binding_path_equals_numpy_path(runtime, tiny_models_root):
    plain = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt", io_binding=False)
    bound = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt", io_binding=True)
    assert bound.scheduler.cache.device == "cpu" and plain.scheduler.cache.device is None
    a = await asyncio.gather(*(generate(plain, p, max_new_tokens=15) for p in PROMPTS))
    b = await asyncio.gather(*(generate(bound, p, max_new_tokens=15) for p in PROMPTS))
    assert a == b
    await plain.stop()
    await bound.stop()


async def test_a_decoder_without_logits_positions_serves_the_same(runtime, tiny_models_root, tmp_path):
    """Model directories exported before the graph took `logits_positions` (logits at every
    position) still serve, with the same logits and greedy tokens, prefix cache included."""
    model_dir = load_model_dir(tiny_models_root / "tiny-gpt")
    old_graph = without_logits_positions(
        model_dir.file(model_dir.manifest.graph("decoder", "fp32").file), tmp_path / "old.onnx"
    )
    new, tok = _sessions(GenerationModel, runtime, model_dir)
    old = runtime.create_session(old_graph)
    models = [GenerationModel(model_dir.manifest, s, tok, runtime.settings, runtime, "fp32") for s in (new, old)]
    for m in models:
        await m.start()
    assert models[0].io.logits_positions and not models[1].io.logits_positions
    prompts = [models[0].tokenizer.encode(p).ids for p in PROMPTS[:3]]
    caches = [m.scheduler.cache for m in models]
    last = [c.prefill(prompts) for c in caches]
    assert last[0].shape == last[1].shape == (3, models[0].io.vocab_size)
    np.testing.assert_allclose(last[0], last[1], rtol=0, atol=1e-5)
    every = [c.prefill(prompts[:1], every_position=True) for c in caches]
    np.testing.assert_allclose(every[0], every[1], rtol=0, atol=1e-5)
    extended = [c.extend(3, [5, 6, 7], every_position=False)[-1] for c in caches]
    np.testing.assert_allclose(extended[0], extended[1], rtol=0, atol=1e-5)
    for c in caches:
        c.reset()
    shared = "Once upon a time there was a little"  # the second prompt continues the first's cached row
    tokens = [[await generate(m, p, max_new_tokens=12) for p in (shared, shared + " girl")] for m in models]
    assert tokens[0] == tokens[1]
    for m in models:
        await m.stop()


async def test_seed_reproduces_sampling_in_any_crowd(runtime, tiny_models_root):
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    params = dict(max_new_tokens=20, temperature=0.9, top_k=50, top_p=0.95, repetition_penalty=1.2, seed=42)
    alone = await generate(model, "Once", **params)
    others = [generate(model, p, max_new_tokens=10, temperature=1.0) for p in PROMPTS]
    crowd = await asyncio.gather(generate(model, "Once", **params), *others)
    assert crowd[0] == alone
    assert await generate(model, "Once", **{**params, "seed": 43}) != alone
    await model.stop()


def _torch_translator(model: TranslationModel):
    return tiny_model("translation", model.io.vocab_size)


def _ids(model: TranslationModel, text: str) -> torch.Tensor:
    return torch.tensor([model.tokenizer.encode(text).ids])


async def test_translation_greedy_matches_pytorch_and_beam_one(runtime, tiny_models_root):
    model = await load(TranslationModel, runtime, tiny_models_root, "tiny-translate")
    ref = _torch_translator(model)
    greedy = await model.translate(SOURCES, TranslateOptions(max_length=24))
    beam1 = await model.translate(SOURCES, TranslateOptions(beam_size=1, max_length=24, length_penalty=1.0))
    for text, out in zip(SOURCES, greedy.translations, strict=True):
        src = _ids(model, text)
        expected = ref.greedy_decode(src, torch.ones_like(src), 24)[0]
        assert out.text == model.tokenizer.decode(expected, skip_special_tokens=True)
    assert beam1.translations == greedy.translations
    await model.stop()


def test_beam_search_with_one_beam_is_greedy_search(runtime, tiny_models_root):
    """The beam algorithm itself at k = 1 (the service routes beam 1 to argmax) agrees with greedy."""
    model_dir = load_model_dir(tiny_models_root / "tiny-translate")
    encoder, decoder, tok = _sessions(TranslationModel, runtime, model_dir)
    model = TranslationModel(model_dir.manifest, encoder, decoder, tok, runtime.settings, runtime, "fp32")
    ids, mask = pad_right([tok.encode(s).ids for s in SOURCES])
    cross = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    results = []
    for greedy in (True, False):
        sources = [SourceSearch(1, model.start_id, model.eos_id, n, 0.7, greedy) for n in (8, 30, 20, 30)]
        batch = Seq2SeqBatch(decoder, model.io, None, model.max_positions)
        batch.join(sources, cross, mask)
        while batch.rows:
            assert all(exc is None for _, exc in batch.step())
        results.append([s.result for s in sources])
    assert [h.tokens for h in results[0]] == [h.tokens for h in results[1]]
    assert [h.score for h in results[0]] == pytest.approx([h.score for h in results[1]], abs=1e-5)


def pad_right(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(rows), max(map(len, rows))), np.int64)  # (n, S)
    mask = np.zeros_like(ids)  # (n, S)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return ids, mask


async def test_beam_score_is_length_normalised_logprob(runtime, tiny_models_root):
    """The reported score equals PyTorch's teacher-forced log-probability of the output / len^lp."""
    model = await load(TranslationModel, runtime, tiny_models_root, "tiny-translate")
    ref = _torch_translator(model)
    lp = 0.8
    result = await model.translate(SOURCES, TranslateOptions(beam_size=4, max_length=24, length_penalty=lp))
    for text, out in zip(SOURCES, result.translations, strict=True):
        src, tokens = _ids(model, text), out.token_ids
        ys = torch.tensor([[model.start_id, *tokens[:-1]]])
        with torch.no_grad():
            logits = ref(src, torch.ones_like(src), ys, torch.ones_like(ys))[0].numpy()  # (T, V)
        logp = log_softmax(logits)[np.arange(len(tokens)), tokens].sum()
        assert out.score == pytest.approx(logp / len(tokens) ** lp, abs=1e-4)
    await model.stop()


async def test_concurrent_translations_batch_together(runtime, tiny_models_root):
    model = await load(TranslationModel, runtime, tiny_models_root, "tiny-translate")
    alone = [(await model.translate([s], TranslateOptions(max_length=16))).translations[0] for s in SOURCES]
    together = await asyncio.gather(*(model.translate([s], TranslateOptions(max_length=16)) for s in SOURCES))
    assert [r.translations[0].text for r in together] == [t.text for t in alone]
    assert model.scheduler.turns < 2 * len(SOURCES)  # some calls shared the batch
    await model.stop()


async def test_cancel_frees_the_row_within_one_step(runtime, tiny_models_root):
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    others = [asyncio.ensure_future(generate(model, p, max_new_tokens=60)) for p in PROMPTS[:3]]
    handle = model.submit("Once upon a time", SamplingParams(max_new_tokens=60))
    await handle.__anext__()
    seq = handle.sequence
    at_cancel = len(seq.generated)
    handle.cancel()
    while seq in model.scheduler.running:
        await asyncio.sleep(0.001)
    assert len(seq.generated) <= at_cancel + 1 < 60
    assert all(len(t) == 60 or t[-1] == model.eos_id for t in await asyncio.gather(*others))
    assert model.scheduler.cache.rows == 0
    await model.stop()


def test_in_flight_counts_each_row_out_once_whatever_the_delivery_order(runtime, tiny_models_root):
    """The compute thread runs ahead of the event loop: a step's delivery can still be queued when the
    next step frees a row cancelled in between. The loop then sees that row in two deliveries; the
    in-flight gauge must drop by one (it went to -1 in CI), and a row cancelled while a prefill runs
    must be counted out too. The scheduler is driven step by step here, with no loop task."""
    from prometheus_client import REGISTRY

    model_dir = load_model_dir(tiny_models_root / "tiny-gpt")
    model = GenerationModel(
        model_dir.manifest, *_sessions(GenerationModel, runtime, model_dir), runtime.settings, runtime, "fp32"
    )  # not started
    sched = model.scheduler
    in_flight = lambda: REGISTRY.get_sample_value("ts_generations_in_flight", {"model": model.name})  # noqa: E731
    a = model.submit("Once upon a time", SamplingParams(max_new_tokens=50))
    b = model.submit("The cat", SamplingParams(max_new_tokens=50))
    sched._deliver(sched._prefill(sched._admit()))
    assert in_flight() == 2 and sched.cache.rows == 2

    queued = sched._decode()  # not yet delivered when the loop cancels `a`
    a.cancel()
    freed = sched._decode()
    assert a.sequence not in sched.running and sched.cache.rows == 1
    sched._deliver(queued)
    sched._deliver(freed)
    assert in_flight() == 1

    c = model.submit("Hi", SamplingParams(max_new_tokens=50))
    newcomers = sched._admit()
    b.cancel()  # while c's prefill runs: b leaves in the prefill's delivery
    sched._deliver(sched._prefill(newcomers))
    assert [s is c.sequence for s in sched.running] == [True] and in_flight() == 1
    c.cancel()
    sched._deliver(sched._decode())
    assert in_flight() == 0 and sched.idle and sched.cache.rows == 0


async def test_ready_returns_queued_chunks_in_order_then_the_queued_error(runtime, tiny_models_root):
    model = await load(GenerationModel, runtime, tiny_models_root, "tiny-gpt")
    alone = await generate(model, "Tom and Sue", max_new_tokens=30)
    handle = model.submit("Tom and Sue", SamplingParams(max_new_tokens=30))
    while not handle.sequence.done:  # the reader falls behind: every chunk is queued already
        await asyncio.sleep(0.005)
    first = await handle.__anext__()
    rest = handle.ready()
    assert rest and rest[-1].finish_reason is not None
    assert all(c.finish_reason is None for c in [first, *rest[:-1]])
    assert [t for c in [first, *rest] for t in c.token_ids] == alone
    assert handle.ready() == []
    with pytest.raises(StopAsyncIteration):
        await handle.__anext__()

    failing = model.submit("Tom", SamplingParams(max_new_tokens=30))
    await failing.__anext__()
    failing.cancel()
    failing.ready()  # whatever was posted so far is taken
    failing.sequence.outbox.post(Unavailable("the server is shutting down"))
    assert failing.ready() == []
    with pytest.raises(Unavailable):
        await failing.__anext__()
    await model.stop()


@pytest.mark.gpu
@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs onnxruntime-gpu + CUDA")
async def test_cuda_fp32_decoder_is_served_unbound(tiny_models_root):
    """onnxruntime's CUDA GroupQueryAttention takes fp16 and bf16 only: on a GPU a float32 decoder
    is refused under strict_provider, and otherwise served unbound (session.run each step); the fp32
    translator (its attention on CUDA) beam-searches as the CPU does. The unbound tokens are checked
    against PyTorch on the trained generator (tests/export/test_gpu_checkpoints.py): on these random
    weights CUDA's fp32 GEMMs flip near-ties (one of four prompts at its 17th token on an H200)."""
    outputs = {}
    for device in ("cpu", "cuda"):
        settings = Settings.from_env(env={}, models=str(tiny_models_root), variant="fp32", device=device)
        rt = Runtime(settings)
        model = await load(GenerationModel, rt, tiny_models_root, "tiny-gpt")
        assert model.scheduler.cache.device == ("cpu" if device == "cpu" else None)
        outputs[device] = await asyncio.gather(*(generate(model, p, max_new_tokens=20) for p in PROMPTS))
        assert all(0 < len(tokens) <= 20 for tokens in outputs[device])
        translator = await load(TranslationModel, rt, tiny_models_root, "tiny-translate")
        outputs[device + "-beam"] = (await translator.translate(SOURCES, TranslateOptions(beam_size=3))).translations
        await model.stop()
        await translator.stop()
        rt.close()
    assert [t.text for t in outputs["cpu-beam"]] == [t.text for t in outputs["cuda-beam"]]
    strict = Runtime(
        Settings.from_env(env={}, models=str(tiny_models_root), variant="fp32", device="cuda", strict_provider=True)
    )
    with pytest.raises(ProviderError, match="GroupQueryAttention takes float16 and bfloat16 only"):
        await load(GenerationModel, strict, tiny_models_root, "tiny-gpt")
    strict.close()
