"""transformer-serving: torch-free gRPC serving of ONNX transformers (see README.md)."""
