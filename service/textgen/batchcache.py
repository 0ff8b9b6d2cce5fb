"""The generation scheduler's KV cache: a buffer the decoder graph updates in place.

The generation decoder is exported with GroupQueryAttention (export/onnx_export.py): each
layer's keys and values live in one buffer (capacity, H, L, D) allocated once, L = the model's
context. Row r's tokens sit at slots [0, length_r) of buffer row r and the active rows are buffer
rows [0, B): both are contiguous, so the graph's past and present are bound (IO binding, by
pointer) to the same memory and the graph writes each new key in place. No step copies the cache
(a concatenating decoder copies all of it every step: 30 % of a step at 8 rows here); a row that
leaves is replaced by moving the later rows down (`keep`). On CUDA the buffers live on the
device and rows move through the host (rows leave rarely).

The scheduler asks: `prefill(prompts)` runs the newcomers' prompts, appends them as rows and
returns each one's last-position logits (n, V); `step(tokens)` feeds one token per row and
returns the logits (B, V); `keep(rows)` drops the other rows; `reset()` empties the cache after a
failed step. A row's next position is the number of tokens it has cached.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.textgen.kvcache import GraphIO


class SlotCache:
    def __init__(self, session: ort.InferenceSession, io: GraphIO, capacity: int, max_length: int,
                 device: str | None = "cpu"):
        """device: "cpu" (host buffers bound in place), "cuda" (device buffers), or None (no binding:
        `session.run` gets the rows' buffers and its present is copied back; for comparison)."""
        self.session, self.io, self.capacity, self.max_length, self.device = session, io, capacity, max_length, device
        self._shape = (capacity, io.n_heads, max_length, io.head_dim)
        self._row_bytes = int(np.prod(self._shape[1:])) * np.dtype(io.kv_dtype).itemsize
        self._host: list[np.ndarray] | None = None
        self._dev: list[ort.OrtValue] | None = None
        self.lengths = np.zeros(capacity, np.int64)  # tokens cached per buffer row
        self.rows = 0
        self._steps: dict[int, tuple[ort.IOBinding, dict[str, np.ndarray]]] = {}  # per row count

    @property
    def tokens(self) -> int:
        """Cached tokens of the active rows (what a step attends over)."""
        return int(self.lengths[: self.rows].sum())

    def _buffers(self) -> None:
        """Allocates the buffers at first use (capacity x context x layers: tens of MB)."""
        if self._host is None and self._dev is None:
            if self.device == "cuda":
                self._dev = [ort.OrtValue.ortvalue_from_shape_and_type(self._shape, self.io.kv_dtype, "cuda", 0)
                             for _ in self.io.past_names]
            else:
                self._host = [np.zeros(self._shape, self.io.kv_dtype) for _ in self.io.past_names]

    def _run(self, ids: np.ndarray, positions: np.ndarray, lengths_after: np.ndarray, start: int) -> np.ndarray:
        """One graph call for buffer rows [start, start + n): ids, positions (n, T); lengths_after (n,)
        = each row's length once these tokens are cached. -> logits (n, T, V)."""
        n = ids.shape[0]
        feeds = {"input_ids": ids, "position_ids": positions, "seqlens_k": (lengths_after - 1).astype(np.int32),
                 "total_sequence_length": np.asarray(lengths_after.max(), np.int32)}
        if self.device is None:  # plain run: the graph copies past into a new present, copied back here
            outputs = self.session.run(["logits", *self.io.present_names],
                                       {**feeds, **{name: buf[start : start + n]
                                                    for name, buf in zip(self.io.past_names, self._host)}})
            for buf, present in zip(self._host, outputs[1:]):
                buf[start : start + n] = present
            return outputs[0]
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        binding.bind_output("logits", "cpu")
        self._bind_rows(binding, start, n)
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    def _bind_rows(self, binding: ort.IOBinding, start: int, n: int) -> None:
        """Binds past and present of buffer rows [start, start + n) to the same memory, by address."""
        shape = [n, *self._shape[1:]]
        for i, (past, present) in enumerate(zip(self.io.past_names, self.io.present_names)):
            base = self._dev[i].data_ptr() if self._dev is not None else self._host[i].ctypes.data
            ptr = base + start * self._row_bytes
            binding.bind_input(past, self.device, 0, self.io.kv_dtype, shape, ptr)
            binding.bind_output(present, self.device, 0, self.io.kv_dtype, shape, ptr)

    def _step_binding(self, n: int) -> tuple[ort.IOBinding, dict[str, np.ndarray]]:
        """The binding of a decode step over rows [0, n), made once per row count: the buffers and
        the step's small input and logits arrays are bound by address, so a step only writes the
        inputs' values (binding 20 tensors per step cost more than the step's attention)."""
        if n not in self._steps:
            arrays = {"input_ids": np.zeros((n, 1), np.int64), "position_ids": np.zeros((n, 1), np.int64),
                      "seqlens_k": np.zeros(n, np.int32), "total_sequence_length": np.zeros((), np.int32),
                      "logits": np.zeros((n, 1, self.io.vocab_size), self.io.kv_dtype)}
            binding = self.session.io_binding()
            for name, a in arrays.items():
                bind = binding.bind_output if name == "logits" else binding.bind_input
                bind(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
            self._bind_rows(binding, 0, n)
            self._steps[n] = (binding, arrays)
        return self._steps[n]

    def prefill(self, prompts: list[list[int]]) -> np.ndarray:
        """Prompts (each <= max_length tokens) -> their last-position logits (n, V); they become
        rows [B, B + n). Rows are right-padded; a shorter row's length tells the graph where it ends."""
        self._buffers()
        n = len(prompts)
        if self.rows + n > self.capacity:
            raise RuntimeError(f"KV cache holds {self.capacity} rows; {self.rows} + {n} asked")
        lengths = np.asarray([len(p) for p in prompts], np.int64)
        ids = np.zeros((n, int(lengths.max())), np.int64)  # (n, T), right-padded
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = p
        positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape)
        logits = self._run(ids, np.ascontiguousarray(positions), lengths, self.rows)  # (n, T, V)
        self.lengths[self.rows : self.rows + n] = lengths
        self.rows += n
        return logits[np.arange(n), lengths - 1]  # (n, V)

    def step(self, tokens: list[int]) -> np.ndarray:
        """One new token per active row (in row order) -> logits (B, V), valid until the next step."""
        rows = self.rows
        lengths = self.lengths[:rows]
        if int(lengths.max()) >= self.max_length:
            raise RuntimeError(f"a row would pass the model's context of {self.max_length} tokens")
        if self.device is None:
            logits = self._run(np.asarray(tokens, np.int64)[:, None], lengths[:, None].copy(), lengths + 1, 0)[:, -1]
        else:
            binding, a = self._step_binding(rows)
            a["input_ids"][:, 0] = tokens
            a["position_ids"][:, 0] = lengths
            a["seqlens_k"][:] = lengths  # length after this token, minus one
            a["total_sequence_length"][...] = lengths.max() + 1
            self.session.run_with_iobinding(binding)
            logits = a["logits"][:, -1]  # (B, V): overwritten by the next step
        self.lengths[:rows] += 1
        return logits

    def keep(self, rows: list[int]) -> None:
        """Keeps these rows (ascending) as rows [0, len(rows)), moving each down to its new slot."""
        moves = [(dst, src) for dst, src in enumerate(rows) if dst != src]
        if moves and self._dev is not None:  # device buffers: rearrange through the host (rows leave rarely)
            host = [v.numpy() for v in self._dev]
            for buf, dev in zip(host, self._dev):
                for dst, src in moves:
                    buf[dst] = buf[src]
                dev.update_inplace(buf)
        elif moves:
            for buf in self._host:
                for dst, src in moves:
                    length = int(self.lengths[src])
                    buf[dst, :, :length] = buf[src, :, :length]
        for dst, src in moves:
            self.lengths[dst] = self.lengths[src]
        self.rows = len(rows)

    def reset(self) -> None:
        self.rows = 0
