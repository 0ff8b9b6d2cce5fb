"""`python -m export convert` on a Qwen3 folder: a generation model with per-head q/k RMSNorm.

The checkpoint is built here, offline, like the other decoder converters' (test_convert_decoders.py):
a tiny `Qwen3Config` with head_dim 16 != hidden / heads (8), two KV heads for four query heads, an
untied head and q/k norm weights away from one (random, so a norm applied in the wrong place or not
at all changes the logits), `save_pretrained`, a byte-level BPE trained in code. Served greedy
tokens, for prompts of different lengths sent together, equal transformers' `generate`; the
conversion's reference check (logits within 1e-3 of transformers) is in the manifest.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from client import generate_request
from tests.export.convert.test_convert_decoders import (
    NEW_TOKENS,
    PROMPTS,
    byte_bpe,
    llama_sizes,
    transformers_greedy,
    widen,
)
from tests.paths import ROOT


def random_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Every RMSNorm weight (the q/k norms included) drawn around one."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.3)
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "qwen3"
    tok = byte_bpe(folder, bos=False)
    config = Qwen3Config(
        **llama_sizes(len(tok), num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
        bos_token_id=None,
        eos_token_id=0,
    )
    random_norms(widen(Qwen3ForCausalLM(config))).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def models_root(folder, tmp_path_factory) -> Path:
    """Converted through the command line, as a user would."""
    root = tmp_path_factory.mktemp("converted")
    command = [sys.executable, "-m", "export", "convert", str(folder), "--out", str(root), "--name", "qwen3"]
    subprocess.run(command, check=True, cwd=ROOT, capture_output=True)
    return root


def test_manifest_says_qk_norm_and_head_dim(models_root):
    manifest = json.loads((models_root / "qwen3" / "model.json").read_text())
    arch = manifest["architecture"]
    assert manifest["kind"] == "generation" and arch["qk_norm"] and arch["head_dim"] == 16
    assert arch["n_kv_heads"] == 2 and not arch["tied_head"] and not arch["qkv_bias"]
    past = next(t for t in manifest["graphs"][0]["inputs"] if t["name"] == "past_key_values.0.key")
    assert past["shape"] == ["batch", 2, "max_sequence", 16]
    reference = manifest["extra"]["converted_from"]["reference"]["generation"]
    assert reference["logits_max_abs_diff"] <= 1e-3 and reference["greedy_tokens_equal"] > 0


async def test_generate_matches_transformers(folder, models_root, start_server):
    server = await start_server(models_root)
    requests = [generate_request(prompt, model="qwen3", max_new_tokens=NEW_TOKENS) for prompt in PROMPTS]
    replies = await asyncio.gather(*(server.generation.Generate(r) for r in requests))  # one right-padded batch
    for prompt, reply in zip(PROMPTS, replies, strict=True):
        assert list(reply.token_ids) == transformers_greedy(folder, prompt), prompt
