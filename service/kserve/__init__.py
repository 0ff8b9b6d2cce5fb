"""The Open Inference Protocol (KServe v2) over gRPC: `inference.GRPCInferenceService` (servicer.py)
over the served models, its tensors mapped to the service's own requests (converters.py)."""
