"""Text generation: a GPT-style decoder with a KV cache, continuous batching and sampling (GenerationService)."""
