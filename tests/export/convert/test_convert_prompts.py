"""Instruction prompts: a sentence-transformers folder's `prompts` and `default_prompt_name`
converted into the manifest and applied per call through gRPC, the OpenAI door and KServe REST.

The folder is built here, offline (a tiny random-weight BERT, a tokenizer trained in code, the
sentence-transformers files); served vectors are compared with `SentenceTransformer.encode` on
the same folder with the same prompt (cosine >= 0.99999), token counts with its tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import grpc
import httpx2 as httpx
import numpy as np
import openai
import pytest
from sentence_transformers import SentenceTransformer
from transformers import BertConfig, BertModel

from client import Client
from export.convert import ConversionError, convert
from service.manifest import ModelDirError, load_model_dir
from service.proto import inference_pb2 as pb
from tests.client.test_service_client import cli
from tests.export.convert.test_convert_encoders import sentence_transformers_folder, sizes, widen, wordpiece
from tests.fixtures.server import status_of

PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = ["The cat sat on the mat.", "Once upon a time, there was a little girl who loved books.", "short"]
NAME = "st-prompts"


def st_config(folder: Path, prompts: object, default: object) -> None:
    config = {"prompts": prompts, "default_prompt_name": default, "similarity_fn_name": "cosine"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A sentence-transformers BERT folder (mean pooling, normalised) with prompts, default "query"."""
    folder = tmp_path_factory.mktemp("hf") / NAME
    tok = wordpiece(folder)
    widen(BertModel(BertConfig(**sizes(tok.vocab_size, max_position_embeddings=64)))).save_pretrained(folder)
    sentence_transformers_folder(folder, "mean")
    st_config(folder, PROMPTS, "query")
    return folder


@pytest.fixture(scope="module")
def models_root(folder, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("converted")
    convert(folder, root / NAME, name=NAME)
    return root


@pytest.fixture(scope="module")
def reference(folder) -> SentenceTransformer:
    return SentenceTransformer(str(folder), device="cpu", local_files_only=True)


def cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)


def vectors(reply: pb.EmbedResponse) -> np.ndarray:
    return np.array([list(e.values) for e in reply.embeddings], dtype=np.float32)


def st_tokens(reference: SentenceTransformer, prefix: str) -> int:
    """Tokens sentence-transformers feeds the model for TEXTS after prefix (padding left out)."""
    features = reference.tokenize([prefix + t for t in TEXTS])
    return int(features["attention_mask"].sum())


def test_manifest_holds_the_prompts(models_root):
    extra = load_model_dir(models_root / NAME).manifest.extra
    assert extra["prompts"] == PROMPTS and extra["default_prompt_name"] == "query"


@pytest.mark.parametrize(
    "fields, st_args, prefix",
    [
        ({"prompt_name": "passage"}, {"prompt_name": "passage"}, "passage: "),
        ({"prompt_name": "query"}, {"prompt_name": "query"}, "query: "),
        ({}, {}, "query: "),  # the default prompt
        ({"prompt": "Represent this: "}, {"prompt": "Represent this: "}, "Represent this: "),
        ({"prompt": ""}, {"prompt": ""}, ""),  # an explicit empty prompt: no prefix, not the default
    ],
    ids=["passage", "query", "default", "explicit", "none"],
)
async def test_grpc_embed_equals_sentence_transformers(fields, st_args, prefix, models_root, reference, start_server):
    server = await start_server(models_root)
    reply = await server.embedding.Embed(pb.EmbedRequest(model=NAME, inputs=TEXTS, **fields))
    want = reference.encode(TEXTS, **st_args)
    assert cosines(vectors(reply), want).min() >= 0.99999
    assert reply.usage.input_tokens == st_tokens(reference, prefix)


async def test_prompts_are_listed_and_change_the_vectors(models_root, start_server):
    server = await start_server(models_root)
    (info,) = (await server.models.ListModels(pb.ListModelsRequest())).models
    assert json.loads(info.manifest["prompts"]) == PROMPTS and info.manifest["default_prompt_name"] == "query"
    query = vectors(await server.embedding.Embed(pb.EmbedRequest(model=NAME, inputs=TEXTS, prompt_name="query")))
    passage = vectors(await server.embedding.Embed(pb.EmbedRequest(model=NAME, inputs=TEXTS, prompt_name="passage")))
    bare = vectors(await server.embedding.Embed(pb.EmbedRequest(model=NAME, inputs=TEXTS, prompt="")))
    assert cosines(query, passage).max() < 0.9999 and cosines(query, bare).max() < 0.9999


async def test_http_embeddings_take_prompt_name(models_root, reference, start_server):
    server = await start_server(models_root)
    client = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    calls = (({"prompt_name": "passage"}, {"prompt_name": "passage"}, "passage: "), ({}, {}, "query: "))
    for extra, st_args, prefix in calls:
        reply = await client.embeddings.create(model=NAME, input=TEXTS, encoding_format="float", extra_body=extra)
        got = np.array([d.embedding for d in reply.data], dtype=np.float32)
        assert cosines(got, reference.encode(TEXTS, **st_args)).min() >= 0.99999
        assert reply.usage.prompt_tokens == st_tokens(reference, prefix)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        unknown = await http.post("/v1/embeddings", json={"model": NAME, "input": TEXTS, "prompt_name": "document"})
        wrong_type = await http.post("/v1/embeddings", json={"model": NAME, "input": TEXTS, "prompt_name": 3})
    assert unknown.status_code == 400
    message = unknown.json()["error"]["message"]
    assert "'document'" in message and "'query'" in message and "'passage'" in message
    assert wrong_type.status_code == 400 and "prompt_name" in wrong_type.json()["error"]["message"]


async def test_client_and_cli_take_prompts(models_root, reference, start_server):
    server = await start_server(models_root)

    def calls() -> tuple[np.ndarray, np.ndarray]:
        with Client(server.address, timeout=30) as client:
            named = client.embed_array(TEXTS, model=NAME, prompt_name="passage")
            return named, client.embed_array(TEXTS, model=NAME, prompt="passage: ")

    named, explicit = await asyncio.to_thread(calls)
    want = reference.encode(TEXTS, prompt_name="passage")
    assert cosines(named, want).min() >= 0.99999 and np.array_equal(named, explicit)
    rc, out, _ = await cli(server.address, "embed", TEXTS[0], "--model", NAME, "--prompt-name", "passage")
    got = np.array(json.loads(out)["embeddings"][0]["values"], dtype=np.float32)
    assert rc == 0 and cosines(got[None], want[:1])[0] >= 0.99999
    rc, _, err = await cli(server.address, "embed", "hi", "--model", NAME, "--prompt-name", "nope")
    assert rc == 2 and "INVALID_ARGUMENT" in err and "'passage'" in err


async def test_kserve_rest_takes_prompt_name(models_root, reference, start_server):
    server = await start_server(models_root)
    text = {"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}
    body = {"inputs": [text], "parameters": {"prompt_name": "passage"}}
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        reply = await http.post(f"/v2/models/{NAME}/infer", json=body)
        unknown = await http.post(f"/v2/models/{NAME}/infer", json={**body, "parameters": {"prompt_name": "x"}})
    assert reply.status_code == 200, reply.text
    output = reply.json()["outputs"][0]
    got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    assert cosines(got, reference.encode(TEXTS, prompt_name="passage")).min() >= 0.99999
    assert unknown.status_code == 400 and "'passage'" in unknown.json()["error"]


async def test_bad_prompt_choices_are_invalid_argument(models_root, start_server):
    server = await start_server(models_root)
    cases = [
        ({"prompt_name": "document"}, "'document' is not a prompt of model 'st-prompts' (its prompts: 'query'"),
        ({"prompt_name": "query", "prompt": "q: "}, "not both"),
        ({"prompt": "x" * 20000}, "at most 16384"),
    ]
    for fields, expected in cases:
        code, details = await status_of(server.embedding.Embed(pb.EmbedRequest(model=NAME, inputs=TEXTS, **fields)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and expected in details, (fields, details)


async def test_a_model_without_prompts_refuses_prompt_name(start_server, embed_models_root):
    server = await start_server(embed_models_root)
    code, details = await status_of(server.embedding.Embed(pb.EmbedRequest(inputs=["hi"], prompt_name="query")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "its prompts: none" in details
    plain = await server.embedding.Embed(pb.EmbedRequest(inputs=["hi"]))
    prompted = await server.embedding.Embed(pb.EmbedRequest(inputs=["hi"], prompt="query: "))
    assert prompted.usage.input_tokens > plain.usage.input_tokens


def test_bad_prompts_are_refused_at_conversion(folder, tmp_path):
    copy = tmp_path / "bad"
    shutil.copytree(folder, copy)
    for prompts, default, match in (
        (PROMPTS, "document", "default_prompt_name = 'document' is not one of its prompts"),
        ({"query": 3}, None, "prompts must map prompt names to prefix texts"),
    ):
        st_config(copy, prompts, default)
        with pytest.raises(ConversionError, match=match):
            convert(copy, tmp_path / "out", name="bad")
        assert not (tmp_path / "out").exists()
    st_config(copy, PROMPTS, None)
    pooling = copy / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    with pytest.raises(ConversionError, match="include_prompt"):
        convert(copy, tmp_path / "out", name="bad")


def test_manifest_check_refuses_bad_prompts(models_root, tmp_path):
    directory = tmp_path / NAME
    shutil.copytree(models_root / NAME, directory)
    manifest = json.loads((directory / "model.json").read_text())
    for extra, match in (
        ({"prompts": PROMPTS, "default_prompt_name": "x"}, "default_prompt_name 'x' is not one of extra.prompts"),
        ({"prompts": ["query: "]}, "extra.prompts must map prompt names to prefix texts"),
    ):
        (directory / "model.json").write_text(json.dumps({**manifest, "extra": {**manifest["extra"], **extra}}))
        with pytest.raises(ModelDirError, match=match):
            load_model_dir(directory)
