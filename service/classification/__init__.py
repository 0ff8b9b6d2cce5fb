"""Rerankers and sequence classifiers (kind "classification"): pairs and texts through the encoder batcher."""
