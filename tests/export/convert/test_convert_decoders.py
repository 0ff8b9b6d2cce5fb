"""`python -m export convert` on GPT-2, Llama, Mistral and Qwen2 folders: generation models.

Each checkpoint is built here, offline: a tiny transformers config, random weights (std 0.3, so
greedy continuations vary), `save_pretrained`, and a tokenizer trained in code on the repository's
held-out text: a GPT-2-style byte-level BPE (GPT-2, Qwen2) or a Llama-style BPE with byte
fallback (`<0xE2>` tokens), a Metaspace pre-tokenizer and BOS from its post-processor (Llama,
Mistral). The four cover: learned positions and a tied head (GPT-2); grouped-query attention
with an untied head and llama3 rotary scaling (Llama); one KV head, head_dim 16 != hidden / heads
and a sliding window shorter than the positions, which caps the context (Mistral); q/k/v biases,
a tied head and linear rotary scaling (Qwen2). The converted directories are served by a real
server: Generate's greedy tokens, for prompts of different lengths sent together (prefilled as
one right-padded batch), equal transformers' `generate(do_sample=False)` on the same folder, and
GenerateStream's chunks joined equal the unary text, multi-byte prompts included. A Llama 3-style
list of end ids stops the served generation (unary, stream, OpenAI) where `generate` stops.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import openai
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from client import generate_request
from export.convert import ConversionError, Options, convert, reference
from service.generation.decoding import REPLACEMENT_CHAR
from service.proto import inference_pb2 as pb
from tests.paths import ROOT

PROMPTS = ["Once upon a time", "Le café était très bon, n'est-ce pas ?", "東京 is far away 🙂👍🏽 é", "Hi"]
NEW_TOKENS = 20


def corpus() -> list[str]:
    lines = (ROOT / "checkpoints" / "tinystories-gpt" / "heldout.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines[:300]] + ["naïve café résumé, Straße über déjà vu"] * 4


def byte_bpe(folder: Path, bos: bool = True) -> PreTrainedTokenizerFast:
    """GPT-2 style: byte-level BPE, `<|endoftext|>` (id 0) ends texts (and begins them, for GPT-2's
    tokenizer; Qwen2's names no BOS), nothing added to an input."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>" if bos else None, eos_token="<|endoftext|>"
    )
    fast.save_pretrained(folder)
    return fast


def llama_bpe(folder: Path) -> PreTrainedTokenizerFast:
    """Llama style: BPE over Metaspace with byte fallback (SentencePiece's 256 `<0xNN>` tokens), `<s>`
    added before every input by the post-processor."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(
        corpus(), trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    )
    spec = json.loads(tok.to_str())
    for byte in range(256):
        spec["model"]["vocab"].setdefault(f"<0x{byte:02X}>", len(spec["model"]["vocab"]))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="first")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)
    return fast


def widen(model: torch.nn.Module) -> torch.nn.Module:
    """Weights of std 0.3 and small random biases; norms stay at one."""
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
        elif name.endswith("bias"):
            torch.nn.init.normal_(p, std=0.1)
    return model.eval()


def llama_sizes(vocab: int, **extra) -> dict:
    return dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        **extra,
    )


def build_checkpoints(root: Path) -> dict[str, Path]:
    folders = {name: root / name for name in ("gpt2", "llama", "mistral", "qwen2")}
    tok = byte_bpe(folders["gpt2"])
    widen(
        GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0
            )
        )
    ).save_pretrained(folders["gpt2"])
    tok = llama_bpe(folders["llama"])
    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    widen(
        LlamaForCausalLM(
            LlamaConfig(
                **llama_sizes(
                    len(tok),
                    num_key_value_heads=2,
                    tie_word_embeddings=False,
                    rope_parameters=llama3,
                    bos_token_id=1,
                    eos_token_id=2,
                )
            )
        )
    ).save_pretrained(folders["llama"])
    tok = llama_bpe(folders["mistral"])
    widen(
        MistralForCausalLM(
            MistralConfig(
                **llama_sizes(
                    len(tok), num_key_value_heads=1, head_dim=16, sliding_window=96, bos_token_id=1, eos_token_id=2
                )
            )
        )
    ).save_pretrained(folders["mistral"])
    tok = byte_bpe(folders["qwen2"], bos=False)
    linear = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    widen(
        Qwen2ForCausalLM(
            Qwen2Config(
                **llama_sizes(
                    len(tok),
                    num_key_value_heads=2,
                    tie_word_embeddings=True,
                    rope_parameters=linear,
                    bos_token_id=None,
                    eos_token_id=0,
                )
            )
        )
    ).save_pretrained(folders["qwen2"])
    return folders


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    return build_checkpoints(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def converted(checkpoints, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("converted")
    for name, folder in checkpoints.items():
        convert(folder, root / name, name=name, variants=("optimized",) if name == "llama" else ())
    return root


def transformers_greedy(folder: Path, prompt: str) -> list[int]:
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([tok(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            num_beams=1,
            pad_token_id=tok.eos_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral", "qwen2"])
async def test_generate_matches_transformers_and_streams_the_same_text(name, checkpoints, converted, start_server):
    server = await start_server(converted)
    requests = [generate_request(prompt, model=name, max_new_tokens=NEW_TOKENS) for prompt in PROMPTS]
    replies = await asyncio.gather(*(server.generation.Generate(r) for r in requests))  # one right-padded batch
    for prompt, request, unary in zip(PROMPTS, requests, replies, strict=True):
        assert list(unary.token_ids) == transformers_greedy(checkpoints[name], prompt), prompt
        chunks = [c.text async for c in server.generation.GenerateStream(request)]
        assert "".join(chunks) == unary.text
        if REPLACEMENT_CHAR not in unary.text:  # no character split across chunks
            assert not any(REPLACEMENT_CHAR in c for c in chunks), chunks


def test_manifests_say_what_was_converted(converted):
    llama = json.loads((converted / "llama" / "model.json").read_text())
    assert llama["architecture"]["n_kv_heads"] == 2 and not llama["architecture"]["tied_head"]
    assert llama["architecture"]["rope_scaling"]["rope_type"] == "llama3"
    assert {g["variant"] for g in llama["graphs"] if g["role"] == "decoder"} == {"fp32", "optimized"}
    past = next(t for t in llama["graphs"][0]["inputs"] if t["name"] == "past_key_values.0.key")
    assert past["shape"] == ["batch", 2, "max_sequence", 8]
    mistral = json.loads((converted / "mistral" / "model.json").read_text())
    assert mistral["architecture"]["max_positions"] == 96  # the sliding window caps the context
    assert mistral["max_input_tokens"] + mistral["max_output_tokens"] == 96
    qwen2 = json.loads((converted / "qwen2" / "model.json").read_text())
    assert "bos" not in qwen2["special_tokens"] and qwen2["special_tokens"]["pad"] == 0
    for name in ("gpt2", "llama", "mistral", "qwen2"):
        source = json.loads((converted / name / "model.json").read_text())["extra"]["converted_from"]
        assert source["reference"]["generation"]["greedy_tokens_equal"] > 0


def copy_with_config(folder: Path, dst: Path, **changes) -> Path:
    shutil.copytree(folder, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return dst


@pytest.mark.parametrize(
    "name, changes, options, field",
    [
        ("llama", {"rope_parameters": None, "rope_scaling": {"type": "yarn", "factor": 4.0}}, {}, "rope_scaling"),
        ("llama", {"hidden_act": "mish"}, {}, "hidden_act"),
        ("llama", {"partial_rotary_factor": 0.5}, {}, "partial_rotary_factor"),
        ("llama", {"quantization_config": {"quant_method": "gptq"}}, {}, "quantization_config"),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, {}, "scale_attn_by_inverse_layer_idx"),
        ("gpt2", {"reorder_and_upcast_attn": True}, {}, "reorder_and_upcast_attn"),
        ("gpt2", {"activation_function": "quick_gelu"}, {}, "activation_function"),
        ("mistral", {}, {"max_input_tokens": 90, "max_output_tokens": 10}, "sliding_window"),
        ("gpt2", {}, {"max_input_tokens": 100, "max_output_tokens": 100}, "n_positions"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(name, changes, options, field, checkpoints, tmp_path):
    folder = copy_with_config(checkpoints[name], tmp_path / name, **changes)
    with pytest.raises(ConversionError, match=field):
        convert(folder, tmp_path / "out", options=Options(**options))
    assert not (tmp_path / "out").exists()


async def test_every_end_token_of_an_eos_list_stops_generation(checkpoints, tmp_path, start_server):
    """Llama 3 lists several end ids (config.json and generation_config.json); `generate` stops at
    any of them, and so must the served model: here at the list's second id, first generated at a
    later step, where the first id is never generated. The prompt is one of the conversion's
    reference texts, so its check meets the stop too."""
    prompt = reference.TEXTS[0]
    free = transformers_greedy(checkpoints["llama"], prompt)  # its eos (2) is never generated here
    assert len(free) == NEW_TOKENS
    step = next(i for i in range(2, NEW_TOKENS) if free[i] not in free[:i])
    never = next(i for i in range(3, 100) if i not in free)
    ends = [never, free[step]]
    folder = copy_with_config(checkpoints["llama"], tmp_path / "hf" / "llama3", eos_token_id=ends)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": ends}))
    expected = transformers_greedy(folder, prompt)
    assert expected == free[: step + 1]  # generate itself stops at the second id

    convert(folder, tmp_path / "models" / "llama3", name="llama3")
    manifest = json.loads((tmp_path / "models" / "llama3" / "model.json").read_text())
    assert manifest["special_tokens"]["eos"] == never and manifest["extra"]["eos_token_ids"] == ends
    assert manifest["extra"]["converted_from"]["reference"]["generation"]["eos_stops_equal"] >= 1
    server = await start_server(tmp_path / "models")
    request = generate_request(prompt, model="llama3", max_new_tokens=NEW_TOKENS)
    unary = await server.generation.Generate(request)
    assert list(unary.token_ids) == expected and unary.finish_reason == pb.FINISH_REASON_EOS
    chunks = [c async for c in server.generation.GenerateStream(request)]
    assert [t for c in chunks for t in c.token_ids] == expected
    assert chunks[-1].finish_reason == pb.FINISH_REASON_EOS
    sdk = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)
    reply = await sdk.completions.create(model="llama3", prompt=prompt, max_tokens=NEW_TOKENS, temperature=0)
    assert reply.choices[0].finish_reason == "stop" and reply.choices[0].text == unary.text


def test_rotary_runs_inside_group_query_attention_where_the_head_allows(converted):
    """Heads of a multiple of 16 values (Mistral's here, every real model's) get their rotary
    positions from GroupQueryAttention (export/onnx/graphs.py), with no rotate-half ops left in
    the graph; the tiny Llama's heads of 8 keep the plain ops. Both generate transformers' tokens
    (the test above)."""
    import onnx

    def graph(name: str) -> onnx.GraphProto:
        return onnx.load(str(converted / name / "decoder.onnx")).graph

    fused, plain = graph("mistral"), graph("llama")
    for g, rotary in ((fused, 1), (plain, 0)):
        gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
        assert gqa and all({a.name: a.i for a in n.attribute}.get("do_rotary", 0) == rotary for n in gqa), rotary
    assert all(
        len(n.input) >= 10 and n.input[9] == "position_ids" for n in fused.node if n.op_type == "GroupQueryAttention"
    )
    assert sum(n.op_type == "Slice" for n in fused.node) < sum(n.op_type == "Slice" for n in plain.node)


def test_int4_settings_from_the_command_line_reach_the_graph_and_the_manifest(checkpoints, tmp_path):
    """`--int4-block-size`, `--int4-head-bits`, `--int4-symmetric` (export/onnx/nbits.py): every
    MatMulNBits takes the block size, the vocabulary projection the head's bits, symmetric blocks
    have no zero points; the manifest records the settings beside the gate's verdict on them."""
    import onnx

    from export.convert.cli import main
    from export.onnx.nbits import Int4Settings
    from service.manifest import load_model_dir

    out = tmp_path / "models"
    flags = ["--variants", "int4", "--int4-block-size", "64", "--int4-head-bits", "4", "--int4-symmetric"]
    assert main(["convert", str(checkpoints["mistral"]), "--out", str(out), "--name", "m", *flags]) == 0
    model_dir = load_model_dir(out / "m")
    spec = model_dir.manifest.graph("decoder", "int4")
    settings = spec.parity["int4"]
    assert (settings["block_size"], settings["head_bits"], settings["symmetric"]) == (64, 4, True)
    assert "quality" in spec.parity and "quality_ok" in spec.parity  # judged by the gate like any int4
    nodes = [n for n in onnx.load(str(model_dir.file(spec.file))).graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == settings["matmuls"] > 1
    attrs = [{a.name: a.i for a in n.attribute} for n in nodes]
    assert all(a["block_size"] == 64 for a in attrs)
    assert sorted(a["bits"] for a in attrs)[-1] == 4  # the head too
    assert all(len(n.input) < 4 or not n.input[3] for n in nodes)  # no zero points
    for bad in ({"block_size": 48}, {"head_bits": 6}):
        with pytest.raises(ValueError):
            Int4Settings(**bad)
