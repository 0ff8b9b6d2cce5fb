"""The PyTorch models: shared layers, the sentence encoder, the decoder with a KV cache, the
encoder-decoder translator and the masked language model (one file per family)."""
