"""Where a graph's weights are stored: inside its .onnx file, or beside it past protobuf's limit.

protobuf refuses to write or parse a message of 2 GiB or more, so a 1B-parameter fp32 graph
(4.4 GB) cannot be one .onnx file. A graph whose tensors hold more than `inline_limit()` bytes is
saved in onnx's external data format instead: the graph in `<file>` and every tensor of at least
1 KiB in one file beside it, `<file>.data` (each initializer names its offset and length there;
onnxruntime and `onnx.load` read it from the graph's folder). The manifest names that file and its
sha256 beside the graph's (docs/model-directory.md). Below the limit a graph stays one file, as
every shipped model is.

`TS_ONNX_INLINE_BYTES` overrides the limit (the tests store tiny graphs outside to check the path).
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from onnx.external_data_helper import _get_all_tensors

PROTOBUF_LIMIT = 1 << 31  # protobuf's largest message: 2 GiB
# Below protobuf's 2 GiB with room for the graph itself (node lists, names, shapes).
INLINE_LIMIT = 3 << 29  # 1.5 GiB
MIN_EXTERNAL_TENSOR = 1024  # smaller tensors (scalars, shapes) stay in the graph


def inline_limit() -> int:
    return int(os.environ.get("TS_ONNX_INLINE_BYTES", INLINE_LIMIT))


def data_file(path: Path) -> Path:
    """The external data file a graph at path is saved with, when it is."""
    return path.with_name(path.name + ".data")


def tensor_bytes(model: onnx.ModelProto) -> int:
    """The bytes the model's tensors hold (initializers, constants, subgraphs), without serializing it."""
    total = 0
    for t in _get_all_tensors(model):
        total += len(t.raw_data) if t.HasField("raw_data") else t.ByteSize()
    return total


def external(model: onnx.ModelProto) -> bool:
    """Whether a model this big is saved with its tensors beside the graph."""
    return tensor_bytes(model) > inline_limit()


def save(model: onnx.ModelProto, path: Path | str) -> Path | None:
    """Saves model at path: one file, or past the limit the graph there and its tensors in
    `data_file(path)`. A stale data file of an earlier save is removed either way. Saving outside
    moves the tensors' bytes to the file, out of `model` (onnx's writer clears them): the caller
    is done with it. -> the data file, or None."""
    path = Path(path)
    data = data_file(path)
    data.unlink(missing_ok=True)
    if not external(model):
        onnx.save(model, str(path))
        return None
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=MIN_EXTERNAL_TENSOR,
        convert_attribute=True,
    )
    data.chmod(0o644)  # onnx writes it private; a server running as another user reads it (as the graph)
    return data


HELD = "held-by-the-caller"  # where a held weight says it is: no such file, so reading it fails loudly


def hold_weights(model: onnx.ModelProto, min_bytes: int) -> dict[str, bytes]:
    """Takes the bytes of every initializer of at least min_bytes out of model (in place), leaving
    its name, type and shape, marked as stored outside in a file that does not exist: a tool that
    reads such a weight fails rather than reading something else. A graph tool that only rewrites
    nodes (a fusion, a shape inference) then works on a model of kilobytes; `restore_weights` puts
    the bytes back. -> {name: bytes}."""
    held: dict[str, bytes] = {}
    for init in model.graph.initializer:
        if init.HasField("raw_data") and len(init.raw_data) >= min_bytes:
            held[init.name] = init.raw_data
            init.ClearField("raw_data")
            init.data_location = onnx.TensorProto.EXTERNAL
            init.external_data.add(key="location", value=HELD)
    return held


def restore_weights(model: onnx.ModelProto, held: dict[str, bytes]) -> list[str]:
    """Gives back what `hold_weights` took, to the initializers still in model (by name; a tool may
    have dropped some); `held` is emptied as it goes, so the bytes are never in memory twice.
    -> the names of held initializers whose bytes are not in `held` (a tool copied one under a
    new name): the model is not whole then."""
    missing = []
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL and any(e.value == HELD for e in init.external_data):
            if init.name not in held:
                missing.append(init.name)
                continue
            init.raw_data = held.pop(init.name)
            init.ClearField("external_data")
            init.ClearField("data_location")
    held.clear()
    return missing


def load(path: Path | str) -> onnx.ModelProto:
    """The graph at path with its tensors, wherever they are stored."""
    return onnx.load(str(path), load_external_data=True)


def files(path: Path) -> list[Path]:
    """The files a saved graph consists of: itself, and its data file when it has one."""
    data = data_file(path)
    return [path, data] if data.exists() else [path]


def past_protobuf(path: Path) -> bool:
    """Whether a saved graph with its tensors is too large to be one protobuf message (tools that
    serialize the whole model, such as onnx's shape inference, refuse it)."""
    return sum(f.stat().st_size for f in files(path)) >= PROTOBUF_LIMIT
