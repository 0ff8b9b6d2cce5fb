"""Translation's continuous batch: per-call options, isolation of failures, admission.

Engines are driven directly (real onnxruntime sessions, the real scheduler task). Results in a
crowd are compared with the same calls alone on the trained translator (checkpoints/tatoeba-en-fr:
decisive weights, so options visibly change outputs) and on the tiny seeded model (which rarely
emits EOS: its calls run to max_length, long enough to be overtaken).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.errors import InvalidArgument, ResourceExhausted, ServiceError
from service.manifest import load_model_dir
from service.runtime import Runtime
from service.settings import Settings
from service.translation import search
from service.translation.engine import Seq2SeqBatch
from service.translation.model import TranslateOptions, TranslationModel

SENTENCES = ["We should leave before it starts raining.", "Yes.", "I think that he is right.", "Where is the station?"]
# (sentences, options): beam 4 at two length penalties that change some outputs, greedy, short caps
CALLS = [
    (SENTENCES, TranslateOptions(beam_size=4, length_penalty=0.2)),
    (SENTENCES, TranslateOptions(beam_size=4, length_penalty=2.0)),
    (SENTENCES[:2], TranslateOptions()),
    (SENTENCES[2:], TranslateOptions(beam_size=2, max_length=4)),
    (["Tom didn't want to go to school today because he was sick."], TranslateOptions(beam_size=3)),
    (SENTENCES[1:3], TranslateOptions(max_length=3, length_penalty=0.5)),
]


async def load(root: Path, name: str, max_batch: int, **kwargs) -> tuple[TranslationModel, Runtime]:
    runtime = Runtime(Settings.from_env(env={}, models=str(root), variant="fp32", translate_max_batch=max_batch))
    model_dir = load_model_dir(root / name)
    model = TranslationModel.load(model_dir, runtime.settings, runtime)
    if kwargs:
        model = TranslationModel(
            model_dir.manifest,
            model.encoder,
            model.decoder,
            model.tokenizer,
            runtime.settings,
            runtime,
            "fp32",
            **kwargs,
        )
    await model.start()
    return model, runtime


@pytest.fixture
async def trained(trained_translator_dir):
    trained_dir = trained_translator_dir
    model, runtime = await load(trained_dir.parent, trained_dir.name, max_batch=8)  # fewer rows than the crowd
    yield model
    await model.stop()
    runtime.close()


@pytest.fixture
async def tiny(tiny_models_root):
    model, runtime = await load(tiny_models_root, "tiny-translate", max_batch=8)
    yield model
    await model.stop()
    runtime.close()


def outputs(result) -> list[tuple[list[int], float]]:
    return [(t.token_ids, t.score) for t in result.translations]


async def alone_then_crowd(model: TranslationModel, calls) -> tuple[list, list]:
    alone = [outputs(await model.translate(texts, opts)) for texts, opts in calls]
    crowd = await asyncio.gather(*(model.translate(texts, opts) for texts, opts in calls))
    return alone, [outputs(r) for r in crowd]


def same(a: list, b: list) -> bool:
    return all(
        [t for t, _ in x] == [t for t, _ in y] and [s for _, s in x] == pytest.approx([s for _, s in y], abs=1e-4)
        for x, y in zip(a, b, strict=True)
    )


async def test_each_call_keeps_its_own_options_in_a_crowd(trained):
    alone, crowd = await alone_then_crowd(trained, CALLS)
    assert same(crowd, alone)
    assert [t for t, _ in alone[0]] != [t for t, _ in alone[1]]  # the two penalties do differ on these sentences
    assert all(len(t) <= 4 for t, _ in alone[3]) and all(len(t) <= 3 for t, _ in alone[5])
    assert trained.scheduler.idle and trained.scheduler.batch.rows == 0


async def test_rows_joining_mid_search_equal_alone_on_both_cache_paths(tiny_models_root):
    """Tiny model: calls run to max_length, so later calls join a batch whose rows are many steps
    ahead (other positions, longer sources); io_binding=True runs the device (OrtValue) path on CPU."""
    texts = ["Hello world.", "The cat sleeps on the mat.", "Yes", "Where is the train station, please?"]
    calls = [
        (texts[:2], TranslateOptions(beam_size=3, max_length=30)),
        (texts[2:], TranslateOptions(max_length=9)),
        (texts[1:], TranslateOptions(beam_size=2, max_length=17, length_penalty=0.3)),
        (texts[:1], TranslateOptions(max_length=40)),
    ]
    results = []
    for io_binding in (False, True):
        model, runtime = await load(tiny_models_root, "tiny-translate", max_batch=8, io_binding=io_binding)
        assert model.scheduler.batch.cache.device == ("cpu" if io_binding else None)
        alone, crowd = await alone_then_crowd(model, calls)
        assert same(crowd, alone)
        results.append(alone)
        await model.stop()
        runtime.close()
    assert same(results[0], results[1])


async def test_a_short_call_overtakes_a_long_beam_search(tiny):
    long = asyncio.ensure_future(
        tiny.translate(
            ["Where is the train station, please?", "The cat sleeps."], TranslateOptions(beam_size=3, max_length=60)
        )
    )  # 6 of 8 rows
    while not tiny.scheduler.members:  # the long search is running
        await asyncio.sleep(0.001)
    short = await tiny.translate(["Yes"], TranslateOptions(max_length=3))
    assert not long.done() and len(short.translations[0].token_ids) <= 3
    assert all(len(t.token_ids) <= 60 for t in (await long).translations)


def poison(max_length: int, original):
    """Wraps a method of SourceSearch / Seq2SeqBatch to fail whenever the poison source takes part."""

    def wrapped(self, *args):
        sources = self.sources if isinstance(self, Seq2SeqBatch) else [self]
        if any(s.max_length == max_length for s in sources):
            raise RuntimeError("poisoned")
        return original(self, *args)

    return wrapped


@pytest.mark.parametrize("where", ["search", "decoder"])
async def test_a_failing_source_fails_its_call_alone(trained, monkeypatch, where):
    """A failure in one source's search fails that source; a decoder call that fails for the whole
    batch restarts its sources alone. Either way only the poisoned call fails (max_length 13
    marks it), every other call gets what it gets alone, and the model serves on."""
    alone, _ = await alone_then_crowd(trained, CALLS[:3])
    if where == "search":
        monkeypatch.setattr(search.SourceSearch, "expand", poison(13, search.SourceSearch.expand))
    else:
        monkeypatch.setattr(Seq2SeqBatch, "step", poison(13, Seq2SeqBatch.step))
    bad = TranslateOptions(beam_size=2, max_length=13)
    crowd = await asyncio.gather(
        *(trained.translate(t, o) for t, o in CALLS[:2]),
        trained.translate(SENTENCES[1:], bad),
        trained.translate(*CALLS[2]),
        return_exceptions=True,
    )
    assert isinstance(crowd[2], ServiceError) and "inputs[0]" in crowd[2].message
    assert crowd[2].code.name == "INTERNAL"
    assert same([outputs(r) for r in crowd[:2] + crowd[3:]], alone)
    monkeypatch.undo()
    assert same([outputs(await trained.translate(*CALLS[0]))], alone[:1])


async def test_a_failing_detokenisation_or_encoding_fails_its_own_call(tiny):
    alone = outputs(await tiny.translate(["Hello world."], TranslateOptions(max_length=8)))
    yes = (await tiny.translate(["Yes"], TranslateOptions(max_length=5))).translations[0].token_ids
    assert yes != alone[0][0]
    real_decode, real_encoder = tiny.tokenizer.decode, tiny.scheduler.encoder

    class Tokenizer:  # the real tokenizer, failing on the output of one source
        def __getattr__(self, name):
            return getattr(tok, name)

        def decode(self, ids, **kwargs):
            if list(ids) == yes:
                raise ValueError("undecodable")
            return real_decode(ids, **kwargs)

    class Encoder:  # the real encoder session, failing on any batch holding a poison token
        def run(self, names, feeds):
            if (feeds["input_ids"] == poison_id).any():
                raise RuntimeError("poisoned")
            return real_encoder.run(names, feeds)

    tok, poison_id = tiny.tokenizer, tiny.tokenizer.encode("Z").ids[0]
    tiny.tokenizer, tiny.scheduler.encoder = Tokenizer(), Encoder()
    calls = [
        tiny.translate(["Hello world."], TranslateOptions(max_length=8)),
        tiny.translate(["Yes"], TranslateOptions(max_length=5)),
        tiny.translate(["Z Z"], TranslateOptions()),
    ]
    good, undecodable, unencodable = await asyncio.gather(*calls, return_exceptions=True)
    assert outputs(good) == alone
    assert isinstance(undecodable, ServiceError) and "inputs[0]" in undecodable.message
    assert isinstance(unencodable, ServiceError) and "inputs[0]" in unencodable.message


async def test_length_penalty_is_bounded_and_scoring_cannot_overflow(tiny):
    assert search.normalised(-3.0, 200, 1e9) == 0.0  # log space: underflows, never raises
    assert search.normalised(-3.0, 4, 1.0) == -0.75
    for lp in (1e9, 10.01, -0.5, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="length_penalty must be in"):
            await tiny.translate(["Yes"], TranslateOptions(length_penalty=lp))
    top = await tiny.translate(["Yes", "Hello world."], TranslateOptions(beam_size=3, max_length=20, length_penalty=10))
    assert all(t.score < 0 for t in top.translations)


async def test_a_call_is_refused_from_its_input_count_before_tokenizing(tiny, monkeypatch):
    tiny.scheduler.max_queue = 3
    calls = []
    monkeypatch.setattr(tiny, "_tokenize", lambda texts: calls.append(texts))
    with pytest.raises(InvalidArgument, match=r"needs 4 places; the translation queue .* holds 3 .*split the call"):
        await tiny.translate(["a", "b", "c", "d"], TranslateOptions())  # can never fit: not a 429
    tiny.scheduler.admission.take(2)  # another call's places
    with pytest.raises(ResourceExhausted, match="queue of model 'tiny-translate' is full"):
        await tiny.translate(["a", "b"], TranslateOptions())
    tiny.scheduler.admission.release(2)
    assert calls == [] and tiny.scheduler.reserved == 0
