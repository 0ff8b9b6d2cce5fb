"""The gRPC door of the inference.v1 services, per kind one module: its servicer and its protobuf <->
plain value converters; each module's `register(server, cores)` adds its service (service/kinds.py
`GRPC_DOORS`)."""
