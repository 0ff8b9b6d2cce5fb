"""Text generation (GPT-style decoder, continuous batching) and translation (encoder-decoder, beam search)."""
