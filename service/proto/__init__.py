"""Generated protobuf and gRPC stubs for protos/inference/v1 (`make protos` regenerates them)."""
