"""The translator decoder's self-attention KV cache (`SlotBatch`) and one decoder step over it.

Per layer a key and a value buffer (R, H, L, D). Row r holds its cached positions in slots
[0, lengths[r]), left-aligned; the decoder graph's GroupQueryAttention (export/onnx/graphs.py)
reads each row's length from `seqlens_k`, writes the row's new key at slot lengths[r] and attends
over exactly its own slots. A row's keys never move with its neighbours' lengths, so its logits are
the same alone or in any batch, bit for bit (the right-aligned, masked cache this replaces moved
them by ~1e-6, which an int8 graph's rounding turned into 0.04).

Rows join with nothing cached (`add_rows`: length 0, their first step writes slot 0), leave and
are reordered or repeated by beam search (`select`). L, the buffer's slots, grows by doubling when
the longest row needs more (`SLOTS_FIRST` at first) and shrinks to what the rows need when they
change. On CPU the buffers are numpy arrays (no IO binding: `session.run` returns the grown cache,
a copy a step, as the concatenated past did) or OrtValues bound as both past and present, so the
graph writes each new key in place; on CUDA OrtValues on the device, brought to the host only when
rows change. (The generation decoder's cache is service/generation/cache.py.)
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.engine.graphio import GraphIO

SLOTS_FIRST = 32  # the first buffer's slots: a sentence's translation mostly fits


def slots_for(needed: int, limit: int) -> int:
    """The buffer length for rows needing `needed` slots: a power of two from SLOTS_FIRST, at most limit."""
    slots = SLOTS_FIRST
    while slots < needed:
        slots *= 2
    return max(min(slots, limit), needed)


class SlotBatch:
    """Left-aligned batch KV cache with per-row lengths; numpy arrays or OrtValues (module doc)."""

    def __init__(self, io: GraphIO, max_slots: int, device: str | None = None):
        """max_slots: the most positions a row may cache (the model's); device: None (numpy, no
        binding), "cpu" or "cuda" (OrtValues bound in place)."""
        self.io, self.max_slots, self.device = io, max_slots, device
        self.lengths = np.zeros(0, np.int64)  # (R,) cached positions per row
        self._host: list[np.ndarray] | None = self._zeros(0, 0)
        self._dev: list[ort.OrtValue] | None = None

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def slots(self) -> int:
        """The buffers' length L."""
        if self._host is not None:
            return self._host[0].shape[2]
        return int(self._device()[0].shape()[2])

    def _zeros(self, rows: int, slots: int) -> list[np.ndarray]:
        return [
            np.zeros((rows, self.io.n_heads, slots, self.io.head_dim), self.io.kv_dtype) for _ in self.io.past_names
        ]

    def _device(self) -> list[ort.OrtValue]:
        if self._dev is None:  # one of the two always holds the cache
            raise RuntimeError("SlotBatch holds neither host nor device buffers")
        return self._dev

    def host(self) -> list[np.ndarray]:
        """The buffers as numpy arrays (brought from the device when they live there)."""
        if self._host is None:
            # a copy while the OrtValues live: on CPU numpy() views memory that dies with them
            self._host = [np.array(v.numpy()) for v in self._device()]
            self._dev = None
        return self._host

    def add_rows(self, n: int) -> None:
        """Appends n rows with nothing cached."""
        host = self.host()
        self._host = [np.concatenate([a, np.zeros((n, *a.shape[1:]), a.dtype)]) for a in host]  # (R+n, H, L, D)
        self.lengths = np.concatenate([self.lengths, np.zeros(n, np.int64)])

    def select(self, rows: np.ndarray) -> None:
        """Keeps these rows in this order, a row repeated where it appears more than once (beam
        search's parents); the buffers shrink to what the kept rows need."""
        idx = np.asarray(rows, np.int64)
        self.lengths = self.lengths[idx]
        keep = slots_for(int(self.lengths.max(initial=0)) + 1, self.max_slots) if idx.size else 0
        self._host = [np.ascontiguousarray(a[idx, :, :keep]) for a in self.host()]  # (R', H, L', D), a copy

    def _ensure(self, needed: int) -> None:
        """Grows the buffers (a copy) when a row's next step needs more slots than they have."""
        if needed <= self.slots:
            return
        if needed > self.max_slots:
            raise RuntimeError(f"a row would pass the model's {self.max_slots} positions")
        grown = self._zeros(self.rows, slots_for(needed, self.max_slots))
        for new, old in zip(grown, self.host()):
            new[:, :, : old.shape[2]] = old
        self._host = grown

    def _bound(self) -> list[ort.OrtValue]:
        """The buffers as OrtValues on the device (uploaded when they changed on the host)."""
        if self._dev is None:
            self._dev = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a), self.device, 0) for a in self.host()]
            self._host = None
        return self._dev

    def step(self, session: ort.InferenceSession, feeds: dict[str, np.ndarray], constants: dict) -> np.ndarray:
        """One decoder call over every row: feeds (input_ids (R, 1), position_ids (R, 1)), constants
        (the inputs fixed across steps: a translator's cross K/V and source mask, numpy or
        OrtValues already on the device). Each row's length grows by one; -> logits (R, V)."""
        rows = self.rows
        lengths_after = self.lengths + 1
        self._ensure(int(lengths_after.max()))
        inputs = {
            **feeds,
            "seqlens_k": (lengths_after - 1).astype(np.int32),
            "total_sequence_length": np.asarray(lengths_after.max(), np.int32),
        }
        if self.device is None:
            past = dict(zip(self.io.past_names, self.host()))
            outputs = session.run(["logits", *self.io.present_names], {**inputs, **constants, **past})
            self._host = outputs[1:]  # the same slots: the buffer is longer than every row
            logits = outputs[0]
        else:
            binding = session.io_binding()
            for name, value in inputs.items():
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            for name, value in constants.items():
                if isinstance(value, ort.OrtValue):
                    binding.bind_ortvalue_input(name, value)
                else:
                    binding.bind_cpu_input(name, np.ascontiguousarray(value))
            binding.bind_output("logits", "cpu")  # first: get_outputs() follows the binding order
            shape = [rows, self.io.n_heads, self.slots, self.io.head_dim]
            for value, past_name, present_name in zip(self._bound(), self.io.past_names, self.io.present_names):
                binding.bind_input(past_name, self.device, 0, self.io.kv_dtype, shape, value.data_ptr())
                binding.bind_output(present_name, self.device, 0, self.io.kv_dtype, shape, value.data_ptr())
            session.run_with_iobinding(binding)
            logits = binding.get_outputs()[0].numpy()
        self.lengths = lengths_after
        return logits[:, -1, :]  # (R, V)
