"""The HTTP door: OpenAI-compatible embeddings and completions, models, translate and health, served by
uvicorn in the gRPC server's event loop over the same models (docs/design/http.md)."""
