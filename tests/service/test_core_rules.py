"""Rules the cores state once for every door (service/core.py, the kinds' query types), on a real server:
0 means the default in a translation's options whoever builds them, and each kind's blank-text rule."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from client import embed_request, translate_request
from service.errors import InvalidArgument
from service.translation.core import TranslateQuery
from service.translation.model import TranslateOptions
from tests.fixtures.server import status_of


@pytest.fixture(scope="module")
def translate_models_root(tiny_models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-translate and tiny-embed: the two kinds whose blank rules differ."""
    root = tmp_path_factory.mktemp("translate-models")
    for name in ("tiny-translate", "tiny-embed"):
        (root / name).symlink_to(Path(tiny_models_root) / name, target_is_directory=True)
    return root


async def test_zero_is_the_default_for_every_door(start_server, translate_models_root):
    """beam_size 0 and length_penalty 0 are 1 and 1.0 in the core's own options too: a door that builds
    TranslateOptions itself got a length penalty of 0 (the raw log-probability sum) before."""
    srv = await start_server(translate_models_root)
    core, texts = srv.server.cores.translation, ["Hello world.", "Yes"]
    explicit = await core.translate(TranslateQuery(texts, TranslateOptions(beam_size=1, length_penalty=1.0)))
    zeros = await core.translate(TranslateQuery(texts, TranslateOptions(beam_size=0, length_penalty=0.0)))
    assert zeros.translations == explicit.translations  # texts, scores and tokens
    wire = await srv.translation.Translate(translate_request(texts))  # proto fields left 0
    assert [t.text for t in wire.translations] == [t.text for t in explicit.translations]
    assert [t.score for t in wire.translations] == pytest.approx([t.score for t in explicit.translations])


async def test_each_kind_states_its_blank_rule(start_server, translate_models_root):
    """Translation refuses a whitespace-only sentence like an empty one; embedding embeds it."""
    srv = await start_server(translate_models_root)
    with pytest.raises(InvalidArgument, match=r"inputs\[1\] is empty"):
        await srv.server.cores.translation.translate(TranslateQuery(["Yes", " \t "], TranslateOptions()))
    code, details = await status_of(srv.translation.Translate(translate_request(["Yes", "   "])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[1] is empty" in details
    reply = await srv.embedding.Embed(embed_request(["   ", "text"]))
    assert len(reply.embeddings) == 2
    code, details = await status_of(srv.embedding.Embed(embed_request(["text", ""])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "inputs[1] is empty" in details
