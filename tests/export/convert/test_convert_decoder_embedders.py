"""Decoder embedders: Qwen3-Embedding-shaped and Llama sentence-transformers folders converted to
the embedding kind and served, checked against `SentenceTransformer.encode` on the same folder.

Both folders are built here, offline (tiny random weights, tokenizers trained in code):
- qwen3-embed, the Qwen3-Embedding shape: weights saved from `Qwen3Model` (no `model.` prefix, no
  LM head) under a config naming `Qwen3ForCausalLM`; a byte-level BPE whose post-processor appends
  <|endoftext|> (the pooled token), loaded as `Qwen2Tokenizer` and padding on the left; Pooling
  `pooling_mode_lasttoken` + Normalize; Qwen3-Embedding's instruction prompts (`query`, no default).
- llama-embed: weights saved from `LlamaForCausalLM` (its LM head dropped), a Llama BPE adding <s>
  before and </s> after each input, right padding, a default prompt.
Served vectors (gRPC Embed, packed and padded; the OpenAI door) reach cosine >= 0.99999 with
sentence-transformers (which pads on the tokenizer's side), token counts equal what it feeds the
model, and a row's vector is the same alone, in a batch of other lengths, or padded on either side.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import openai
import pytest
from sentence_transformers import SentenceTransformer
from tokenizers import Tokenizer, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

from export.convert import ConversionError, Options, convert
from export.gate.parity import pad_batch
from service.proto import inference_pb2 as pb
from service.proto import inference_pb2_grpc as pb_grpc
from tests.export.convert.test_convert_decoders import byte_bpe, copy_with_config, llama_bpe, llama_sizes, widen
from tests.export.convert.test_convert_encoders import sentence_transformers_folder
from tests.export.convert.test_convert_prompts import cosines, vectors
from tests.export.convert.test_convert_qwen3 import random_norms

QWEN3_PROMPTS = {
    "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
}
LLAMA_PROMPTS = {"query": "query: ", "passage": "passage: "}
TEXTS = [
    "What is the capital of China?",
    "Explain gravity",
    "The capital of China is Beijing. It is a city of more than twenty million people, old and new.",
    "é",
    " ".join(f"word{i}" for i in range(60)),  # past max_seq_length: truncated, the appended EOS kept
]
MAX_SEQ_LENGTH = 40
PROMPTS = {"qwen3-embed": QWEN3_PROMPTS, "llama-embed": LLAMA_PROMPTS}
NAMES = tuple(PROMPTS)


def last_token_pipeline(folder: Path, prompts: dict, default: str | None) -> None:
    """modules.json (Transformer, Pooling, Normalize) with last-token pooling, and the prompts."""
    sentence_transformers_folder(folder, "mean")
    pooling = {"word_embedding_dimension": 32, "pooling_mode_lasttoken": True, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LENGTH}))
    config = {"prompts": prompts, "default_prompt_name": default, "similarity_fn_name": "cosine"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(config))


def qwen3_embedder(folder: Path) -> None:
    backend = byte_bpe(folder, bos=False).backend_tokenizer
    backend.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|endoftext|>", pad_token="<|endoftext|>", padding_side="left"
    )
    tok.save_pretrained(folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())  # loaded as Qwen3-Embedding's is
    (folder / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "tokenizer_class": "Qwen2Tokenizer"}))
    sizes = llama_sizes(len(tok), num_key_value_heads=2, head_dim=16)
    random_norms(widen(Qwen3Model(Qwen3Config(**sizes, eos_token_id=0)))).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}))
    last_token_pipeline(folder, QWEN3_PROMPTS, None)


def llama_embedder(folder: Path) -> None:
    backend = llama_bpe(folder).backend_tokenizer
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    tok.save_pretrained(folder)
    sizes = llama_sizes(len(tok), num_key_value_heads=2, tie_word_embeddings=False)
    widen(LlamaForCausalLM(LlamaConfig(**sizes, bos_token_id=1, eos_token_id=2))).save_pretrained(folder)
    last_token_pipeline(folder, LLAMA_PROMPTS, "query")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    qwen3_embedder(root / "qwen3-embed")
    llama_embedder(root / "llama-embed")
    return {name: root / name for name in NAMES}


@pytest.fixture(scope="module")
def models_root(folders, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("converted")
    for name, folder in folders.items():
        convert(folder, root / name, name=name)
    return root


@pytest.fixture(scope="module")
def references(folders) -> dict[str, SentenceTransformer]:
    return {name: SentenceTransformer(str(f), device="cpu", local_files_only=True) for name, f in folders.items()}


def st_tokens(reference: SentenceTransformer, texts: list[str]) -> int:
    return int(reference.tokenize(texts)["attention_mask"].sum())


def test_manifests_say_decoder_embedder(models_root):
    for name, prompts in PROMPTS.items():
        manifest = json.loads((models_root / name / "model.json").read_text())
        assert manifest["kind"] == "embedding" and manifest["pooling"] == "last"
        assert manifest["architecture"]["type"] == "decoder-embedder" and manifest["embedding_dim"] == 32
        assert manifest["max_input_tokens"] == MAX_SEQ_LENGTH and manifest["extra"]["prompts"] == prompts
        assert {g["role"] for g in manifest["graphs"]} >= {"encoder", "packed"}
        assert manifest["extra"]["converted_from"]["reference"]["embedding"]["cos_min"] >= 0.99999
    assert json.loads((models_root / "qwen3-embed" / "model.json").read_text())["architecture"]["qk_norm"]


@pytest.mark.parametrize("pack_row_tokens", [128, 0], ids=["packed", "padded"])
@pytest.mark.parametrize("name", NAMES)
async def test_grpc_embed_equals_sentence_transformers(name, pack_row_tokens, models_root, references, start_server):
    """One call of texts of different lengths (one truncated), with the query prompt and without."""
    server = await start_server(models_root, embed_pack_row_tokens=pack_row_tokens)
    reference = references[name]
    for fields, prefix in (({"prompt_name": "query"}, PROMPTS[name]["query"]), ({"prompt": ""}, "")):
        reply = await server.embedding.Embed(pb.EmbedRequest(model=name, inputs=TEXTS, **fields))
        assert cosines(vectors(reply), reference.encode(TEXTS, **fields)).min() >= 0.99999, fields
        assert reply.usage.input_tokens == st_tokens(reference, [prefix + t for t in TEXTS])


@pytest.mark.parametrize("pack_row_tokens", [128, 0], ids=["packed", "padded"])
async def test_a_rows_vector_does_not_depend_on_its_batch(pack_row_tokens, models_root, start_server):
    server = await start_server(models_root, embed_pack_row_tokens=pack_row_tokens)
    for name in NAMES:
        together = vectors(await server.embedding.Embed(pb.EmbedRequest(model=name, inputs=TEXTS)))
        for i, text in enumerate(TEXTS):
            alone = vectors(await server.embedding.Embed(pb.EmbedRequest(model=name, inputs=[text])))
            assert np.abs(alone[0] - together[i]).max() <= 1e-5, (name, text)


async def test_openai_embeddings_take_prompt_name(models_root, references, start_server):
    server = await start_server(models_root)
    client = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    for name in NAMES:
        reply = await client.embeddings.create(
            model=name, input=TEXTS, encoding_format="float", extra_body={"prompt_name": "query"}
        )
        got = np.array([d.embedding for d in reply.data], dtype=np.float32)
        assert cosines(got, references[name].encode(TEXTS, prompt_name="query")).min() >= 0.99999


def embed(session: ort.InferenceSession, seqs: list[list[int]], left: bool) -> np.ndarray:
    ids, mask = pad_batch(seqs, 0, left=left)
    return session.run(None, {"input_ids": ids, "attention_mask": mask})[0]


def test_the_graph_pools_the_last_real_token_on_either_padding_side(models_root):
    """The padded graph alone (onnxruntime): left- and right-padded batches give each row's vector alone."""
    tokenizer = Tokenizer.from_file(str(models_root / "qwen3-embed" / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    seqs = [e.ids for e in tokenizer.encode_batch(TEXTS)]
    assert all(s[-1] == 0 for s in seqs)  # each ends with the appended <|endoftext|>, the long one too
    session = ort.InferenceSession(str(models_root / "qwen3-embed" / "encoder.onnx"))
    alone = np.concatenate([embed(session, [s], left=False) for s in seqs])
    for left in (True, False):
        assert np.abs(embed(session, seqs, left) - alone).max() <= 1e-5, left


async def test_attention_inspection_gives_causal_maps(models_root, start_server):
    server = await start_server(models_root)
    stub = pb_grpc.InspectionServiceStub(server.channel)
    response = await stub.Attention(pb.AttentionRequest(model="qwen3-embed", text=TEXTS[0]))
    assert response.kind == "embedding" and response.source_tokens[-1] == "<|endoftext|>"
    assert {m.kind for m in response.maps} == {pb.CAUSAL} and len(response.maps) == 2 * 4
    for m in response.maps:
        weights = np.array(m.weights, dtype=np.float32).reshape(m.rows, m.cols)
        assert (weights[np.triu_indices(m.rows, k=1)] == 0).all()
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize(
    "pooling, changes, options, match",
    [
        ({"pooling_mode_mean_tokens": True}, {}, {}, "pooling mode"),
        ({}, {"max_position_embeddings": 32}, {}, "max_position_embeddings"),
        ({}, {}, {"pooling": "cls"}, "--pooling"),
        ({}, {"hidden_act": "mish"}, {}, "hidden_act"),
    ],
    ids=["mean-pooling", "too-long", "cls-option", "activation"],
)
def test_unsupported_embedders_are_refused_before_writing(pooling, changes, options, match, folders, tmp_path):
    folder = copy_with_config(folders["qwen3-embed"], tmp_path / "qwen3", **changes)
    if pooling:
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pooling}))
    with pytest.raises(ConversionError, match=match):
        convert(folder, tmp_path / "out", options=Options(**options))
    assert not (tmp_path / "out").exists()
