"""The gRPC door of the inference.v1 services: per kind one module (its servicer and its protobuf <->
plain value converters, which the HTTP and KServe doors reuse), `models.py` (ModelService) and the
pieces they share (`converters.py`, `packing.py`). Each module's `register(server, cores)` adds its
service (service/server.py `GRPC_DOORS`); KServe's gRPC binding is service/kserve/servicer.py."""
