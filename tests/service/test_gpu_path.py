"""The device-resident decode path (service/generation/cache.py), run on the CPU.

The GPU runs the same code with "cuda" OrtValues: step inputs at fixed addresses refilled with
`update_inplace`, KV rows moved device to device, CUDA-graph steps padded to a bucket. Here the
trained generator (checkpoints/tinystories-gpt: decisive logits, unlike random tiny weights) decodes
many greedy steps through that path and through plain `session.run`; a step fed stale inputs (the
bug found on CUDA: IO binding copies a host input when bound, not at each run) changes the tokens
within a few steps. The CUDA tests at the end skip cleanly without onnxruntime-gpu and a GPU.
"""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from service.engine.graphio import GraphIO
from service.engine.rowcopy import RowCopier, blocks
from service.generation.cache import SlotCache
from service.generation.decoding import SamplingParams
from service.generation.model import GenerationModel
from service.manifest import ModelDir, load_model_dir
from service.runtime import CUDA, Runtime
from service.settings import Settings
from tests.fixtures.models import cached_build
from tests.paths import ROOT

GENERATOR = ROOT / "checkpoints" / "tinystories-gpt"
PROMPTS = ["Once upon a time", "The little dog", "Tom and Sue went to the park. They", "She"]
STEPS = 40


@pytest.fixture(scope="session")
def trained_gpt() -> ModelDir:
    """The shipped trained generator, exported fp32 (cached under build/test-cache/)."""
    from export.modeldir import source_hash
    from export.train.checkpoint import build_checkpoint

    if not (GENERATOR / "model.safetensors").is_file():
        pytest.skip("the trained generator checkpoint is not here")
    key = "trainedgpt-" + source_hash([GENERATOR / "model.safetensors"], salt="fp32")[:16]
    root = cached_build(key, ["tinystories-gpt"], lambda tmp: build_checkpoint(GENERATOR, tmp / "tinystories-gpt", ()))
    return load_model_dir(root / "tinystories-gpt")


def _cache(model_dir: ModelDir, runtime: Runtime, device: str | None, capacity: int = 8) -> SlotCache:
    m = model_dir.manifest
    session = runtime.create_session(model_dir.file(m.graph("decoder", "fp32").file))
    io = GraphIO.inspect(session, m.architecture)
    return SlotCache(session, io, capacity, int(m.architecture["max_positions"]), device=device)


def _greedy(cache: SlotCache, prompts: list[list[int]], steps: int, leave_at: int) -> list[list[int]]:
    """Greedy tokens of each prompt; at step `leave_at` row 1 leaves (the last row takes its place)."""
    out = [[int(t)] for t in cache.prefill(prompts).argmax(-1)]
    alive = list(range(len(prompts)))
    for step in range(steps):
        if step == leave_at:
            order = cache.keep([i for i in range(len(alive)) if i != 1])
            alive = [alive[i] for i in order]
        logits = cache.step([out[r][-1] for r in alive])
        for r, t in zip(alive, logits.argmax(-1), strict=True):
            out[r].append(int(t))
    return out


@pytest.fixture
def runtime():
    rt = Runtime(Settings.from_env(env={}, device="cpu"))
    yield rt
    rt.close()


def test_device_step_equals_plain_run_over_many_steps(trained_gpt, runtime):
    """Rows of different lengths, 40 greedy steps, a row leaving halfway: the bound OrtValue path
    (the one CUDA runs) gives the plain session.run path's tokens, and its memory is not numpy's."""
    tokenizer = Tokenizer.from_file(str(trained_gpt.file(trained_gpt.manifest.tokenizer["file"])))
    prompts = [[0, *tokenizer.encode(p).ids] for p in PROMPTS]
    plain = _greedy(_cache(trained_gpt, runtime, None), prompts, STEPS, leave_at=STEPS // 2)
    bound_cache = _cache(trained_gpt, runtime, "cpu")
    bound = _greedy(bound_cache, prompts, STEPS, leave_at=STEPS // 2)
    assert bound == plain
    assert len(set(plain[0])) > 8  # a real story, not one token repeated
    assert bound_cache._copier.runs > 0  # the leaving row moved the later ones through the copy graph
    step = bound_cache._steps[len(prompts) - 1]
    assert all(v.data_ptr() != step.host[name].ctypes.data for name, v in step.values.items())


def test_graph_layout_equals_plain_steps(trained_gpt, runtime):
    """The CUDA-graph step layout (rows padded to a bucket, total_sequence_length fixed at the
    context, a gpu_graph_id run option) run on a CPU session: same tokens as the exact one."""
    prompts = [[0, 5, 9, 200, 31], [0, 44], [0, 7, 7, 12]]  # 3 rows: bucket 4, one padded row
    exact = _greedy(_cache(trained_gpt, runtime, "cpu"), prompts, STEPS, leave_at=10)
    padded_cache = _cache(trained_gpt, runtime, "cpu")
    padded_cache.enable_graphs(padded_cache.session)
    assert padded_cache.graphs and padded_cache.buckets() == [1, 2, 4, 8]
    assert _greedy(padded_cache, prompts, STEPS, leave_at=10) == exact
    assert sorted(padded_cache._steps) == [2, 4]  # 3 rows, then 2: buckets, not row counts


def test_blocks_never_overlap_their_source():
    assert blocks([(1, 2), (2, 3), (3, 4)]) == [(1, 2, 1), (2, 3, 1), (3, 4, 1)]  # shift 1: row by row
    assert blocks([(0, 2), (1, 3), (2, 4), (3, 5)]) == [(0, 2, 2), (2, 4, 2)]  # shift 2: two rows at a time
    assert blocks([(0, 1), (1, 4), (2, 5)]) == [(0, 1, 1), (1, 4, 2)]


def test_row_copier_moves_rows_like_numpy():
    rng = np.random.default_rng(0)
    shape = (6, 2, 5, 4)  # (rows, H, L, D)
    data = [rng.normal(size=shape).astype(np.float32) for _ in range(3)]
    values = [ort.OrtValue.ortvalue_from_numpy(d.copy()) for d in data]
    row_bytes = int(np.prod(shape[1:])) * 4
    copier = RowCopier(["CPUExecutionProvider"], "cpu", [v.data_ptr() for v in values], row_bytes)
    keep = [0, 2, 4, 5]
    copier.move([(dst, src) for dst, src in enumerate(keep) if dst != src])
    for d, v in zip(data, values, strict=True):
        np.testing.assert_array_equal(v.numpy()[: len(keep)], d[keep])


async def test_cuda_graph_setting_falls_back_on_cpu(tiny_models_root, caplog):
    """cuda_graph on a CPU host: the plain step path, same tokens as with the setting off, and a
    log line saying why graphs are off."""
    tokens = {}
    for graphs in (False, True):
        rt = Runtime(Settings.from_env(env={}, device="cpu", variant="fp32", cuda_graph=graphs))
        with caplog.at_level(logging.INFO, logger="service.generation.model"):
            model = GenerationModel.load(load_model_dir(tiny_models_root / "tiny-gpt"), rt.settings, rt)
        await model.start()
        handle = model.submit("Once upon a time", SamplingParams(max_new_tokens=24))
        tokens[graphs] = [t async for chunk in handle for t in chunk.token_ids]
        assert not model.scheduler.cache.graphs
        await model.stop()
        rt.close()
    assert tokens[True] == tokens[False] and len(tokens[True]) == 24
    assert any("CUDA graphs off" in r.getMessage() and "CPUExecutionProvider" in r.getMessage() for r in caplog.records)


@pytest.fixture(scope="session")
def trained_gpt_fp16(trained_gpt, tmp_path_factory) -> ModelDir:
    """The trained generator with its fp16 graph (the variant served on CUDA); GPU tests only."""
    from export.train.checkpoint import build_checkpoint

    return build_checkpoint(GENERATOR, tmp_path_factory.mktemp("fp16") / "tinystories-gpt", ("fp16",))


def _cuda_cache(
    model_dir: ModelDir, variant: str, graphs: bool, device: str | None = "cuda"
) -> tuple[Runtime, SlotCache]:
    """A cache over a CUDA session: bound on the device, or (device None) plain session.run."""
    rt = Runtime(Settings.from_env(env={}, device="cuda", strict_provider=True, cuda_graph=graphs))
    m = model_dir.manifest
    path = model_dir.file(m.graph("decoder", variant).file)
    session = rt.create_session(path)
    cache = SlotCache(
        session, GraphIO.inspect(session, m.architecture), 8, int(m.architecture["max_positions"]), device=device
    )
    if graphs:
        graph_session, reason = rt.create_graph_session(path)
        if graph_session is None:
            pytest.fail(f"no CUDA-graph session for the {variant} decoder: {reason}")
        cache.enable_graphs(graph_session)
    return rt, cache


@pytest.mark.gpu
@pytest.mark.skipif(CUDA not in ort.get_available_providers(), reason="no CUDAExecutionProvider (onnxruntime-gpu)")
def test_cuda_bound_steps_equal_unbound_cuda_steps(trained_gpt_fp16):
    """On a GPU, fp16 (the variant CUDA serves; fp32 attention has no CUDA kernel): the device-resident
    path's greedy tokens equal plain session.run on the same session's graph for 40 steps, a row
    leaving halfway (the row copier on the device)."""
    prompts = [[0, 5, 9, 200, 31], [0, 44], [0, 7, 7, 12]]
    tokens = []
    for device in (None, "cuda"):
        rt, cache = _cuda_cache(trained_gpt_fp16, "fp16", graphs=False, device=device)
        tokens.append(_greedy(cache, prompts, STEPS, leave_at=10))
        rt.close()
    assert tokens[1] == tokens[0]


@pytest.mark.gpu
@pytest.mark.skipif(CUDA not in ort.get_available_providers(), reason="no CUDAExecutionProvider (onnxruntime-gpu)")
def test_cuda_graph_steps_equal_plain_cuda_steps(trained_gpt_fp16):
    """On a GPU, fp16: CUDA-graph replays (buckets 2 and 4, captured after two plain runs each)
    give the plain CUDA steps' greedy tokens. Required before `cuda_graph` may default to on."""
    prompts = [[0, 5, 9, 200, 31], [0, 44], [0, 7, 7, 12]]
    tokens = []
    for graphs in (False, True):
        rt, cache = _cuda_cache(trained_gpt_fp16, "fp16", graphs)
        tokens.append(_greedy(cache, prompts, STEPS, leave_at=10))
        rt.close()
    assert tokens[1] == tokens[0]


def test_cuda_graph_setting_flag_and_env():
    assert Settings.from_env(env={}).cuda_graph is False  # off until a GPU run shows equal tokens
    assert Settings.from_env(env={"TS_CUDA_GRAPH": "1"}).cuda_graph is True
    assert Settings.from_args(["--cuda-graph"], env={}).cuda_graph is True
    assert Settings.from_args(["--no-cuda-graph"], env={"TS_CUDA_GRAPH": "on"}).cuda_graph is False


def test_embedding_batch_limits_by_device_unless_set():
    rt = Runtime(Settings.from_env(env={}, device="cpu"))
    assert rt.embed_batch_limits() == (2048, 32)
    rt.close()
    rt = Runtime(Settings.from_env(env={"TS_EMBED_MAX_BATCH_SIZE": "8"}, device="cpu", embed_max_batch_tokens=512))
    assert rt.embed_batch_limits() == (512, 8)
    rt.close()
