"""Hugging Face folders at the sizes users serve, built offline for bench.converted.

Random weights from transformers' own init (`save_pretrained`) and tokenizers trained here on the
repository's text: the shapes are the real ones, the outputs are not.
- gpt2: `GPT2Config()` defaults (GPT-2 small) with a byte-level BPE tokenizer;
- llama: SmolLM-135M's shape (30 layers, 9 heads, 3 KV heads, tied embeddings) with a BPE tokenizer;
- llama1b: TinyLlama-1.1B's shape (22 layers, 2048 wide, 4 KV heads, untied), 4.4 GB of fp32 weights;
- bert: `BertConfig()` defaults as a sentence-transformers folder (mean pooling, Normalize) with a
  lower-case WordPiece tokenizer;
- qwen3e: a decoder embedder in Qwen3-Embedding-0.6B's layout and widths (hidden 1024, 16 query
  heads of 128, 8 KV heads, q/k norms, FFN 3072) with 4 of its 28 layers and a 32k vocabulary:
  `Qwen3Model` weights, last-token pooling + Normalize, its prompts, a byte-level BPE that appends
  <|endoftext|> and pads on the left, as Qwen3-Embedding's.
The BPE vocabularies are filled up with plain added tokens to the models' sizes, since a random
decoder generates any id and an id without text would hold its stream's chunks back.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORIES = Path("/work/shared/data/tinystories/TinyStories-train.first2MiB.txt")
HELDOUT = {
    "tinystories": (ROOT / "checkpoints/tinystories-gpt/heldout.jsonl", "text"),
    "tatoeba": (ROOT / "checkpoints/tatoeba-en-fr/heldout.jsonl", "source"),
    "wikitext": (ROOT / "checkpoints/mlm-encoder/heldout.jsonl", "text"),
}
EOT = "<|endoftext|>"
BPE_VOCAB, WORDPIECE_VOCAB = 16000, 16000  # what the text can fill; the models' vocabularies stay real
ST_MAX_SEQ_LENGTH = 256
PROMPT_WORDS = 24  # a generation prompt: the first words of a held-out story (about 30 tokens)


def heldout(name: str) -> list[str]:
    path, key = HELDOUT[name]
    return [json.loads(line)[key] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def prompts(count: int) -> list[str]:
    """Generation prompts: the beginnings of `count` held-out TinyStories (the first is the 1-stream one)."""
    return [" ".join(t.split()[:PROMPT_WORDS]) for t in heldout("tinystories")[:count]]


def corpus() -> list[str]:
    """Training text for the tokenizers: the TinyStories sample when present, and the held-out texts."""
    lines = [t for name in HELDOUT for t in heldout(name)]
    if STORIES.is_file():
        lines += [line for line in STORIES.read_text(encoding="utf-8").splitlines() if line and line != EOT]
    return lines


def sentences(count: int) -> list[str]:
    """Mixed-length English inputs for Embed: Tatoeba sentences (short), TinyStories paragraphs
    (medium), WikiText paragraphs (long, some past max_seq_length), interleaved, distinct."""
    pools = [
        heldout("tatoeba"),
        [p for t in heldout("tinystories") for p in t.split("\n") if p.strip()],
        heldout("wikitext"),
    ]
    seen: dict[str, None] = {}
    for i in range(max(len(p) for p in pools)):
        for pool, weight in zip(pools, (3, 2, 1)):
            for text in pool[i * weight : (i + 1) * weight]:
                seen.setdefault(text.strip(), None)
    return list(seen)[:count]


def byte_bpe(folder: Path, vocab_size: int):
    """A GPT-2-style byte-level BPE trained on corpus(), filled up to the model's `vocab_size` with
    plain added tokens `<|extra_N|>` (so that every id a random model generates decodes to text, as
    with a real checkpoint), saved as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=BPE_VOCAB, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, unk_token=EOT)
    fast.add_tokens([f"<|extra_{i}|>" for i in range(len(fast), vocab_size)])
    fast.save_pretrained(folder)
    return fast


def wordpiece(folder: Path):
    """A BERT-style WordPiece ([CLS] ... [SEP], lower case) trained on corpus()."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus(), trainers.WordPieceTrainer(vocab_size=WORDPIECE_VOCAB, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    fast.save_pretrained(folder)
    return fast


def gpt2_folder(folder: Path) -> dict:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config()
    cfg.bos_token_id = cfg.eos_token_id = byte_bpe(folder, cfg.vocab_size).convert_tokens_to_ids(EOT)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(folder)
    return {"params_m": round(model.num_parameters() / 1e6, 1)}


def _llama(folder: Path, vocab_size: int, **shape) -> dict:
    """A random LlamaForCausalLM of the given shape with a byte-level BPE filled up to vocab_size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    eot = byte_bpe(folder, vocab_size).convert_tokens_to_ids(EOT)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        max_position_embeddings=2048,
        bos_token_id=eot,
        eos_token_id=eot,
        **shape,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    return {"params_m": round(model.num_parameters() / 1e6, 1)}


def llama_folder(folder: Path) -> dict:
    return _llama(
        folder,
        49152,
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        tie_word_embeddings=True,
    )


def llama1b_folder(folder: Path) -> dict:
    """TinyLlama-1.1B's shape (22 layers, 32 heads of 64, 4 KV heads, FFN 5632, untied 32k
    vocabulary): 1.1B parameters, 4.4 GB in fp32, past protobuf's 2 GiB (external data)."""
    return _llama(
        folder,
        32000,
        hidden_size=2048,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        intermediate_size=5632,
        tie_word_embeddings=False,
    )


def bert_folder(folder: Path) -> dict:
    import torch
    from transformers import BertConfig, BertModel

    wordpiece(folder)
    torch.manual_seed(0)
    model = BertModel(BertConfig(), add_pooling_layer=False)
    model.save_pretrained(folder)
    mean = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False}
    sentence_transformers_files(folder, model.config.hidden_size, mean)
    return {"params_m": round(model.num_parameters() / 1e6, 1)}


def sentence_transformers_files(folder: Path, dim: int, pooling: dict, extra: dict | None = None) -> None:
    """modules.json (Transformer, Pooling, Normalize), the Pooling config, max_seq_length, and
    config_sentence_transformers.json's `extra` fields where given."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": dim, **pooling}))
    (folder / "2_Normalize").mkdir()
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": ST_MAX_SEQ_LENGTH, "do_lower_case": False})
    )
    if extra:
        (folder / "config_sentence_transformers.json").write_text(json.dumps(extra, indent=2))


def qwen3_embedding_folder(folder: Path) -> dict:
    import torch
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

    vocab = 32000
    backend = byte_bpe(folder, vocab).backend_tokenizer
    eot = backend.token_to_id(EOT)
    backend.post_processor = processors.TemplateProcessing(single=f"$A {EOT}", special_tokens=[(EOT, eot)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOT, pad_token=EOT, padding_side="left")
    tokenizer.save_pretrained(folder)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=1024,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        eos_token_id=eot,
    )
    torch.manual_seed(0)
    model = Qwen3Model(cfg)
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}, indent=2))
    instruction = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
    prompts = {"prompts": {"query": instruction, "document": ""}, "default_prompt_name": None}
    sentence_transformers_files(folder, cfg.hidden_size, {"pooling_mode_lasttoken": True}, prompts)
    return {"params_m": round(model.num_parameters() / 1e6, 1)}


BUILDERS = {
    "gpt2": gpt2_folder,
    "llama": llama_folder,
    "llama1b": llama1b_folder,
    "bert": bert_folder,
    "qwen3e": qwen3_embedding_folder,
}
