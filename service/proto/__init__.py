"""Generated protobuf and gRPC stubs for protos/inference/v1 and protos/kserve/v2 (`make protos` regenerates them)."""
