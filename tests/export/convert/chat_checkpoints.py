"""Tiny random-weight chat checkpoints with real-world templates (tests/data/chat_templates/), built offline.

- `qwen2.5`: Qwen2 weights, a byte-level BPE without BOS, ChatML with tools (`<|im_start|>`,
  `<tool_call>`), the template in `chat_template.jinja` (transformers' save_pretrained).
- `llama3.1`: Llama weights, a BPE whose post-processor adds `<s>` (as Llama 3's adds
  `<|begin_of_text|>`) and a template that writes `bos_token` itself: the double-BOS trap.
- `mistral`: Mistral weights, the same BPE, Mistral-Nemo's `[INST]` / `[TOOL_CALLS]` template, given
  as tokenizer_config.json's named list (`default` and `tool_use`, as some checkpoints ship it).
- `qwen3`: Qwen2 weights, ChatML with `<think>` reasoning and `enable_thinking`.
- `base`: a Qwen2 base model without any template (`--chat-template` gives it one).
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.export.convert.test_convert_decoders import byte_bpe, llama_bpe, llama_sizes, widen
from tests.paths import ROOT

TEMPLATES = ROOT / "tests" / "data" / "chat_templates"
CHATML = ["<|im_start|>", "<|im_end|>"]
QWEN_TOOLS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
LLAMA3 = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
MISTRAL = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]"]
MISTRAL += ["[/TOOL_RESULTS]"]


def sizes(vocab: int, **extra) -> dict:
    """test_convert_decoders' tiny sizes with 2048 positions: a chat with tools is up to ~900 tokens here."""
    return {**llama_sizes(vocab, **extra), "max_position_embeddings": 2048}


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _qwen(folder: Path, chat_template: str | None, eos: str = "<|im_end|>") -> None:
    tok = byte_bpe(folder, bos=False)
    tok.add_special_tokens({"additional_special_tokens": CHATML})
    tok.add_tokens(QWEN_TOOLS)  # Qwen's tool and think tags are added, not special, tokens
    tok.eos_token = eos
    tok.pad_token = "<|endoftext|>"
    if chat_template is not None:
        tok.chat_template = chat_template
    tok.save_pretrained(folder)
    eos_id = tok.convert_tokens_to_ids(eos)
    config = Qwen2Config(**sizes(len(tok), num_key_value_heads=2, bos_token_id=None, eos_token_id=eos_id))
    widen(Qwen2ForCausalLM(config)).save_pretrained(folder)


def _llama(folder: Path) -> None:
    tok = llama_bpe(folder)
    tok.add_special_tokens({"additional_special_tokens": LLAMA3})
    tok.eos_token = "<|eot_id|>"
    tok.chat_template = template("llama-3.1")
    tok.save_pretrained(folder)
    ends = [tok.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "</s>", "<|eom_id|>")]
    config = LlamaConfig(**sizes(len(tok), num_key_value_heads=2, bos_token_id=1, eos_token_id=ends))
    widen(LlamaForCausalLM(config)).save_pretrained(folder)


def _mistral(folder: Path) -> None:
    tok = llama_bpe(folder)
    tok.add_special_tokens({"additional_special_tokens": MISTRAL})
    tok.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    nemo = template("mistral-nemo")
    config["chat_template"] = [{"name": "default", "template": nemo}, {"name": "tool_use", "template": nemo}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = MistralConfig(**sizes(len(tok), num_key_value_heads=1, bos_token_id=1, eos_token_id=2))
    widen(MistralForCausalLM(config)).save_pretrained(folder)


def build(root: Path) -> dict[str, Path]:
    folders = {name: root / name for name in ("qwen2.5", "llama3.1", "mistral", "qwen3", "base")}
    _qwen(folders["qwen2.5"], template("qwen2.5"))
    _llama(folders["llama3.1"])
    _mistral(folders["mistral"])
    _qwen(folders["qwen3"], template("qwen3"))
    _qwen(folders["base"], None, eos="<|endoftext|>")
    return folders
