"""The Open Inference Protocol (KServe v2) over gRPC: `inference.GRPCInferenceService` (servicer.py)
and REST (rest.py, on the HTTP port) over the served models, its tensors mapped to the service's own
requests (converters.py, tensors.py) through one data plane (dataplane.py) and one module per kind."""
