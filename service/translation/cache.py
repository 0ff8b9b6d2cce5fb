"""The translator's decoder KV cache (`KVBatch`) and one decoder step over it (`run_step`).

`KVBatch` is the cache of a decoder with an attention mask and a growing past: per layer key and value
(B, H, L, D) plus a 1/0 mask (B, L) over the L cached slots. Rows of different lengths share it
right-aligned: a row's valid slots are the last `length` columns, padding slots on the left are
masked. Rows join with nothing cached (`add_rows`: all their slots masked, their first step
writes the last column), leave by index, and `compact` drops leading columns no row uses, so L stays the
longest row's length. On CUDA the cache lives on the device as OrtValues (IO binding) between steps and
comes to the host only when rows leave; on CPU it is plain numpy. (The generation decoder's cache is
service/generation/cache.py.)
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.engine.graphio import GraphIO


class KVBatch:
    """Right-aligned batch KV cache; host numpy arrays or device OrtValues (see module doc)."""

    def __init__(self, io: GraphIO, device: str | None = None):
        self.io = io
        self.device = device  # None: numpy; "cpu" / "cuda": OrtValues through IO binding
        self.mask = np.zeros((0, 0), np.int64)  # (B, L)
        self._host: list[np.ndarray] | None = io.empty_past(0)
        self._dev: list[ort.OrtValue] | None = None

    @classmethod
    def empty(cls, io: GraphIO, rows: int, device: str | None = None) -> KVBatch:
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
            if self._dev is None:  # one of the two always holds the cache
                raise RuntimeError("KVBatch holds neither host nor device tensors")
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
            self._dev = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), self.device, 0) for a in self.host()]
            self._host = None
        return self._dev

    def advance(self, present: list, new_mask: np.ndarray) -> None:
        """Takes the step's present tensors as the cache, with new_mask (B, L+T)."""
        if self.device is None:
            self._host, self._dev = present, None
        else:
            self._dev, self._host = present, None
        self.mask = new_mask


def run_step(
    session: ort.InferenceSession,
    io: GraphIO,
    feeds: dict[str, np.ndarray],
    cache: KVBatch,
    constants: dict | None = None,
) -> np.ndarray:
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
