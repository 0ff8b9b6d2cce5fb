"""Training: corpora and splits, tokenizer training, the training loop and its tasks, masking,
evaluation, the checkpoint format and a checkpoint's held-out texts (the gate's quality sample)."""
