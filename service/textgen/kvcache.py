"""Decoder graphs and their KV cache: introspection, a batch cache, and one step of the graph.

`GraphIO.inspect(session)` asks an onnxruntime session once, at load, what the decoder needs:
the `past_key_values.{i}.key|value` inputs (hence the number of layers), heads H and head size D
(from the input shapes, or from the manifest when the graph leaves them symbolic), the KV dtype,
and any extra inputs (a translator's `encoder_attention_mask` and `cross_key_values.*`).

`KVBatch` is the cache of a decoder with an attention mask and a growing past (a translator's
decoder; the generation decoder's cache is `batchcache.SlotCache`): per layer key and value
(B, H, L, D) plus a 1/0 mask (B, L) over the L cached slots. Rows of different lengths share it
right-aligned: a row's valid slots are the last `length` columns, padding slots on the left are
masked. Rows join with nothing cached (`add_rows`: all their slots masked, their first step
writes the last column), leave by index, and `compact` drops leading columns no row uses, so L stays the
longest row's length. On CUDA the cache lives on the device as OrtValues (IO binding) between steps and
comes to the host only when rows leave; on CPU it is plain numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


@dataclass(frozen=True)
class GraphIO:
    """What a decoder graph takes and returns, read from the session."""

    past_names: tuple[str, ...]  # past_key_values.0.key, .0.value, .1.key, ...
    present_names: tuple[str, ...]  # present.0.key, ...
    input_names: tuple[str, ...]
    n_layers: int
    n_heads: int
    head_dim: int
    kv_dtype: type
    vocab_size: int
    buffer_kv: bool = False  # GroupQueryAttention over a fixed-length KV buffer (`seqlens_k` input)

    @staticmethod
    def inspect(session: ort.InferenceSession, architecture: dict) -> "GraphIO":
        inputs = {i.name: i for i in session.get_inputs()}
        layers = sorted({int(m.group(1)) for n in inputs if (m := _PAST.match(n))})
        if not layers or layers != list(range(len(layers))):
            raise ValueError(f"decoder graph has no past_key_values.{{i}}.key|value inputs (inputs: {', '.join(inputs)})")
        past = tuple(f"past_key_values.{i}.{kv}" for i in layers for kv in ("key", "value"))
        present = tuple(f"present.{i}.{kv}" for i in layers for kv in ("key", "value"))
        missing = set(present) - {o.name for o in session.get_outputs()}
        if missing:
            raise ValueError(f"decoder graph lacks outputs {', '.join(sorted(missing))}")
        spec = inputs[past[0]]
        _, heads, _, head_dim = spec.shape
        if not isinstance(heads, int) or not isinstance(head_dim, int):  # the cache holds the KV heads (GQA)
            heads = int(architecture.get("n_kv_heads") or architecture["n_heads"])
            head_dim = int(architecture.get("head_dim") or int(architecture["d_model"]) // int(architecture["n_heads"]))
        logits = next(o for o in session.get_outputs() if o.name == "logits")
        vocab = logits.shape[-1] if isinstance(logits.shape[-1], int) else int(architecture["vocab_size"])
        return GraphIO(past, present, tuple(inputs), len(layers), heads, head_dim,
                       _ORT_DTYPES.get(spec.type, np.float32), vocab, buffer_kv="seqlens_k" in inputs)

    def empty_past(self, rows: int) -> list[np.ndarray]:
        return [np.zeros((rows, self.n_heads, 0, self.head_dim), self.kv_dtype) for _ in self.past_names]


class KVBatch:
    """Right-aligned batch KV cache; host numpy arrays or device OrtValues (see module doc)."""

    def __init__(self, io: GraphIO, device: str | None = None):
        self.io = io
        self.device = device  # None: numpy; "cpu" / "cuda": OrtValues through IO binding
        self.mask = np.zeros((0, 0), np.int64)  # (B, L)
        self._host: list[np.ndarray] | None = io.empty_past(0)
        self._dev: list[ort.OrtValue] | None = None

    @classmethod
    def empty(cls, io: GraphIO, rows: int, device: str | None = None) -> "KVBatch":
        """A cache of `rows` rows and no cached positions yet (all rows start together)."""
        cache = cls(io, device)
        cache.mask = np.zeros((rows, 0), np.int64)
        cache._host = io.empty_past(rows)
        return cache

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    def host(self) -> list[np.ndarray]:
        """The cache as numpy arrays (brings it from the device when it lives there)."""
        if self._host is None:
            self._host = [v.numpy() for v in self._dev]
            self._dev = None
        return self._host

    def keep(self, rows: list[int]) -> None:
        """Keeps only these rows (in this order) and compacts."""
        idx = np.asarray(rows, dtype=np.int64)
        self._host = [a[idx] for a in self.host()]  # (b, H, L, D)
        self.mask = self.mask[idx]
        self.compact()

    def add_rows(self, n: int) -> None:
        """Appends n rows with nothing cached: zero K/V, masked slots; their first step fills the
        last column, so they sit right-aligned like every other row."""
        host = self.host()
        self._host = [np.concatenate([a, np.zeros((n, *a.shape[1:]), a.dtype)]) for a in host]  # (B+n, H, L, D)
        self.mask = np.concatenate([self.mask, np.zeros((n, self.length), np.int64)])  # (B+n, L)

    def compact(self) -> None:
        """Drops leading columns that no row uses."""
        used = np.flatnonzero(self.mask.any(axis=0))
        start = int(used[0]) if used.size else self.length
        if start > 0:
            self._host = [np.ascontiguousarray(a[:, :, start:]) for a in self.host()]  # (B, H, L', D)
            self.mask = self.mask[:, start:]

    def step_feeds(self) -> list[np.ndarray] | list[ort.OrtValue]:
        """The past tensors for the next step, where the step runs them."""
        if self.device is None:
            return self.host()
        if self._dev is None:
            self._dev = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), self.device, 0) for a in self._host]
            self._host = None
        return self._dev

    def advance(self, present: list, new_mask: np.ndarray) -> None:
        """Takes the step's present tensors as the cache, with new_mask (B, L+T)."""
        if self.device is None:
            self._host, self._dev = present, None
        else:
            self._dev, self._host = present, None
        self.mask = new_mask


def run_step(session: ort.InferenceSession, io: GraphIO, feeds: dict[str, np.ndarray], cache: KVBatch,
             constants: dict | None = None) -> np.ndarray:
    """One decoder call over the whole batch: feeds (input_ids (B, T), position_ids (B, T)) + the
    cache + constants (inputs that stay fixed across steps, e.g. a translator's cross K/V: numpy,
    or OrtValues already on the device); attention_mask is the cache mask extended by T ones.
    Updates the cache; returns the logits of the last position (B, V)."""
    rows, new = feeds["input_ids"].shape
    mask = np.concatenate([cache.mask, np.ones((rows, new), np.int64)], axis=1)  # (B, L+T)
    past = cache.step_feeds()
    constants = constants or {}
    if cache.device is None:
        inputs = {**feeds, **constants, "attention_mask": mask, **dict(zip(io.past_names, past))}
        outputs = session.run(["logits", *io.present_names], inputs)
        cache.advance(outputs[1:], mask)
        return outputs[0][:, -1, :]  # (B, V)
    binding = session.io_binding()
    for name, value in {**feeds, "attention_mask": mask}.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(value))
    for name, value in [*constants.items(), *zip(io.past_names, past)]:
        if isinstance(value, ort.OrtValue):
            binding.bind_ortvalue_input(name, value)
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
    binding.bind_output("logits", "cpu")
    for name in io.present_names:
        binding.bind_output(name, cache.device, 0)
    session.run_with_iobinding(binding)
    outputs = binding.get_outputs()
    cache.advance(list(outputs[1:]), mask)
    return outputs[0].numpy()[:, -1, :]  # (B, V)


def to_device(arrays: dict[str, np.ndarray], device: str | None) -> dict:
    """Constant inputs where the step runs them: as is for numpy, else OrtValues on the device."""
    if device is None:
        return arrays
    return {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), device, 0) for k, v in arrays.items()}
