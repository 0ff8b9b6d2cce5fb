"""Batch embedding jobs: embed a large file through the service's EmbedStream, resumably.

    python -m client.batch corpus.jsonl --output embeddings.parquet --address 127.0.0.1:50051

Modules: `sources` (text / JSONL / Parquet input, chunks, shards), `embedder` (one chunk over
EmbedStream with retries and per-item failure isolation), `store` (part files, ledger, merge),
`runner` (bounded concurrency, progress), `cli` (flags). See docs/deploy.md "Batch jobs".
"""
