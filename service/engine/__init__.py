"""Pieces the model kinds share: decoder graph IO, device row copies, the encoder-row batcher, row
packing and encoder tokenization."""
