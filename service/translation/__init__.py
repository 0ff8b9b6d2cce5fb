"""Translation: an encoder-decoder (Marian-style) with beam search, batched across calls (TranslationService)."""
