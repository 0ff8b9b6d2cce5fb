"""`--frontends N`: front-end processes (every door, chat rendering) in front of one engine core
process (every model, batcher and scheduler), over pyzmq with msgspec. docs/design/engine-core.md."""
