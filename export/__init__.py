"""Export: PyTorch model definitions, tokenizer training, training, ONNX export and the parity gate.

The only package of the project that imports torch."""
