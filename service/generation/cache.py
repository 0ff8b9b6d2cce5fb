"""The generation scheduler's KV cache: device buffers the decoder graph updates in place.

Per layer one key and one value buffer (capacity, H, L, D) allocated once on the session's device;
the active rows are buffer rows [0, B), bound by IO binding so the graph writes each new key in
place (no copy per step; a row that leaves is replaced by the last row, rowcopy.py). A decode
step's inputs and logits are OrtValues at fixed addresses, refilled in place; CUDA graphs replay
captured decode steps per row-count bucket (settings `cuda_graph`). Why, and what IO binding does
with host inputs: docs/design/gpu.md.

The scheduler asks: `prefill(prompts)` (last-position logits (n, V), rows appended), `step(tokens)`
(one token per row, logits (B, V)), `keep(rows)` (drops the others, says where the kept went),
`reset()` (empties the cache after a failed step). Prefix caching and speculative decoding
(prefix.py, speculate.py) add `fork(src, length)` (a new row holding another row's first tokens),
`extend(row, tokens)` (one row continued by several tokens in one pass: the graph's attention
takes a multi-token pass over a past for one row at a time), `copy_rows` and `lengths` itself:
a row's length set back rewinds it, the keys beyond it are ignored by `seqlens_k`.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.engine.graphio import GraphIO
from service.engine.rowcopy import RowCopier

HOST_INPUTS = frozenset({"total_sequence_length"})  # GroupQueryAttention's CPU input, on every provider
GRAPH_ID_KEY = "gpu_graph_id"  # onnxruntime run option naming the captured graph to replay


class _StepIO:
    """One decode step's inputs and logits for buffer rows [0, rows): OrtValues at fixed addresses,
    bound once together with the KV rows; `run` refills them in place. total: a fixed
    total_sequence_length (CUDA graphs), or None for the longest row's each step."""

    def __init__(
        self,
        session: ort.InferenceSession,
        cache: SlotCache,
        rows: int,
        total: int | None,
        run_options: ort.RunOptions | None,
    ):
        self.session, self.rows, self.total, self.run_options = session, rows, total, run_options
        self.host: dict[str, np.ndarray] = {
            "input_ids": np.zeros((rows, 1), np.int64),
            "position_ids": np.zeros((rows, 1), np.int64),
            "seqlens_k": np.zeros(rows, np.int32),
            "total_sequence_length": np.zeros((), np.int32),
        }
        if cache.io.logits_positions:  # the one new token of each row: position 0 of the pass, never refilled
            self.host["logits_positions"] = np.zeros((rows, 1), np.int64)
        self.values = {
            name: ort.OrtValue.ortvalue_from_shape_and_type(
                a.shape, a.dtype, "cpu" if name in HOST_INPUTS else cache.device, 0
            )
            for name, a in self.host.items()
        }
        self.logits = ort.OrtValue.ortvalue_from_shape_and_type(
            (rows, 1, cache.io.vocab_size), cache.io.kv_dtype, cache.device, 0
        )
        self.binding = session.io_binding()
        for name, value in self.values.items():
            self.binding.bind_ortvalue_input(name, value)
        self.binding.bind_ortvalue_output("logits", self.logits)
        cache._bind_rows(self.binding, 0, rows)
        self.refill = [name for name in self.values if name != "logits_positions"]
        if total is not None:  # set once: a captured graph keeps the value of its capture anyway
            self.host["total_sequence_length"][...] = total
            self.values["total_sequence_length"].update_inplace(self.host["total_sequence_length"])
            self.refill.remove("total_sequence_length")
        if "logits_positions" in self.values:
            self.values["logits_positions"].update_inplace(self.host["logits_positions"])

    def run(self, tokens: list[int], lengths: np.ndarray) -> np.ndarray:
        """tokens, lengths (n,), n <= rows; rows past n are padding (token 0 at position 0, which
        writes slot 0 of a free buffer row). -> logits (n, V), valid until the next step."""
        n, h = len(tokens), self.host
        h["input_ids"][:n, 0], h["input_ids"][n:] = tokens, 0
        h["position_ids"][:n, 0], h["position_ids"][n:] = lengths, 0
        h["seqlens_k"][:n], h["seqlens_k"][n:] = lengths, 0  # each row's length after this token, minus one
        if self.total is None:
            h["total_sequence_length"][...] = lengths.max() + 1
        for name in self.refill:
            self.values[name].update_inplace(h[name])
        self.session.run_with_iobinding(self.binding, self.run_options)
        return self.logits.numpy()[:n, -1]  # (n, V); on CUDA a copy of the step's logits only


class SlotCache:
    def __init__(
        self, session: ort.InferenceSession, io: GraphIO, capacity: int, max_length: int, device: str | None = "cpu"
    ):
        """device: "cpu" or "cuda" (OrtValue buffers and steps on that device), or None (no binding:
        `session.run` gets the rows' numpy buffers and its present is copied back; for comparison)."""
        self.session, self.io, self.capacity, self.max_length, self.device = session, io, capacity, max_length, device
        self._shape = (capacity, io.n_heads, max_length, io.head_dim)
        self._row_bytes = int(np.prod(self._shape[1:])) * np.dtype(io.kv_dtype).itemsize
        self._host: list[np.ndarray] | None = None  # device None
        self._kv: list[ort.OrtValue] | None = None  # device "cpu" / "cuda"
        self._copier: RowCopier | None = None
        self.lengths = np.zeros(capacity, np.int64)  # tokens cached per buffer row
        self.rows = 0
        self._steps: dict[int, _StepIO] = {}  # per row count, or per bucket with graphs
        self._graph_session: ort.InferenceSession | None = None

    @property
    def tokens(self) -> int:
        """Cached tokens of the active rows (what a step attends over)."""
        return int(self.lengths[: self.rows].sum())

    @property
    def graphs(self) -> bool:
        """Decode steps replay CUDA graphs (per row-count bucket)."""
        return self._graph_session is not None

    def enable_graphs(self, graph_session: ort.InferenceSession) -> None:
        """Decode steps run on graph_session (created with `enable_cuda_graph`): rows padded up to a
        bucket, one graph per bucket. Prefill stays on the plain session; both share the buffers."""
        if self.device is None:
            raise ValueError("CUDA graphs need bound device buffers (device 'cuda')")
        self._graph_session = graph_session
        self._steps.clear()

    def buckets(self) -> list[int]:
        """Row counts a graph is captured for: powers of two below capacity, and capacity."""
        out = [1 << i for i in range(self.capacity.bit_length()) if 1 << i < self.capacity]
        return [*out, self.capacity]

    def _device_buffers(self) -> list[ort.OrtValue]:
        """The device KV buffers; `_buffers` allocates them (prefill), and only with a device."""
        if self._kv is None:
            raise RuntimeError(f"KV cache on device {self.device!r} has no device buffers before its first prefill")
        return self._kv

    def _host_buffers(self) -> list[np.ndarray]:
        """The numpy KV buffers; `_buffers` allocates them (prefill), and only without a device."""
        if self._host is None:
            raise RuntimeError(f"KV cache on device {self.device!r} has no host buffers (only device None has)")
        return self._host

    def _buffers(self) -> None:
        """Allocates the zeroed buffers at first use (capacity x context x layers: tens of MB)."""
        if self._host is not None or self._kv is not None:
            return
        zeros: np.ndarray = np.zeros(self._shape, self.io.kv_dtype)
        if self.device is None:
            self._host = [zeros.copy() for _ in self.io.past_names]
            return
        self._kv = [
            ort.OrtValue.ortvalue_from_shape_and_type(self._shape, self.io.kv_dtype, self.device, 0)
            for _ in self.io.past_names
        ]
        for value in self._kv:
            value.update_inplace(zeros)
        self._copier = RowCopier(
            self.session.get_providers(), self.device, [v.data_ptr() for v in self._kv], self._row_bytes
        )

    def _bind_rows(self, binding: ort.IOBinding, start: int, n: int) -> None:
        """Binds past and present of buffer rows [start, start + n) to the same memory, by address."""
        shape = [n, *self._shape[1:]]
        for value, past, present in zip(self._device_buffers(), self.io.past_names, self.io.present_names):
            ptr = value.data_ptr() + start * self._row_bytes
            binding.bind_input(past, self.device, 0, self.io.kv_dtype, shape, ptr)
            binding.bind_output(present, self.device, 0, self.io.kv_dtype, shape, ptr)

    def _step_io(self, n: int) -> _StepIO:
        """The step binding for n active rows: exact on the plain session, a bucket with graphs."""
        if self._graph_session is None:
            key, session, total, options = n, self.session, None, None
        else:
            key = next(b for b in self.buckets() if b >= n)
            session, total, options = self._graph_session, self.max_length, ort.RunOptions()
            options.add_run_config_entry(GRAPH_ID_KEY, str(key))
        if key not in self._steps:
            self._steps[key] = _StepIO(session, self, key, total, options)
        return self._steps[key]

    def _feeds(self, ids: np.ndarray, positions: np.ndarray, lengths_after: np.ndarray, at: np.ndarray | None) -> dict:
        """A pass's inputs besides the KV rows; at (n, L): the positions of the pass whose logits
        are wanted (None: every position), fed where the graph takes `logits_positions`."""
        feeds = {
            "input_ids": ids,
            "position_ids": positions,
            "seqlens_k": (lengths_after - 1).astype(np.int32),
            "total_sequence_length": np.asarray(lengths_after.max(), np.int32),
        }
        if self.io.logits_positions:
            every = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape)
            feeds["logits_positions"] = np.ascontiguousarray(every if at is None else at, np.int64)
        return feeds

    def _run_plain(
        self, ids: np.ndarray, positions: np.ndarray, lengths_after: np.ndarray, start: int, at: np.ndarray | None
    ) -> np.ndarray:
        """One `session.run` over rows [start, start + n) of the numpy buffers (device None)."""
        n = ids.shape[0]
        feeds = self._feeds(ids, positions, lengths_after, at)
        feeds.update({name: buf[start : start + n] for name, buf in zip(self.io.past_names, self._host_buffers())})
        outputs = self.session.run(["logits", *self.io.present_names], feeds)
        for buf, present in zip(self._host_buffers(), outputs[1:]):
            buf[start : start + n] = present
        return outputs[0]

    def _run_prefill(
        self, ids: np.ndarray, positions: np.ndarray, lengths: np.ndarray, start: int, at: np.ndarray | None = None
    ) -> np.ndarray:
        """A prefill over rows [start, start + n): a fresh binding, so the bind-time copy of these
        host inputs is the right one. at (n, L): the positions whose logits are wanted (None:
        every one). -> logits (n, L, V) on the host; (n, T, V) for a graph without
        `logits_positions`, whatever `at` says."""
        if self.device is None:
            return self._run_plain(ids, positions, lengths, start, at)
        binding = self.session.io_binding()
        feeds = self._feeds(ids, positions, lengths, at)
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        binding.bind_output("logits", "cpu")
        self._bind_rows(binding, start, ids.shape[0])
        self.session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    def prefill(self, prompts: list[list[int]], every_position: bool = False) -> np.ndarray:
        """Prompts (each <= max_length tokens) -> their last-position logits (n, V), or with
        every_position the logits of every position (n, T, V; a row's padding positions are
        garbage); they become rows [B, B + n). Rows are right-padded; a shorter row's length tells
        the graph where it ends."""
        self._buffers()
        n = len(prompts)
        if self.rows + n > self.capacity:
            raise RuntimeError(f"KV cache holds {self.capacity} rows; {self.rows} + {n} asked")
        lengths = np.asarray([len(p) for p in prompts], np.int64)
        ids = np.zeros((n, int(lengths.max())), np.int64)  # (n, T), right-padded
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = p
        positions = np.ascontiguousarray(np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape))
        last = None if every_position else (lengths - 1)[:, None]  # (n, 1): each row's last token
        logits = self._run_prefill(ids, positions, lengths, self.rows, last)  # (n, T or 1, V)
        self.lengths[self.rows : self.rows + n] = lengths
        self.rows += n
        if every_position:
            return logits
        return logits[:, 0] if self.io.logits_positions else logits[np.arange(n), lengths - 1]  # (n, V)

    def extend(self, row: int, tokens: list[int], every_position: bool = True) -> np.ndarray:
        """Continues buffer row `row` by these tokens from its length, in one pass (batch 1: the
        graph's attention takes several new tokens over a past for one row only). -> logits (T, V),
        or without every_position at least the last position's (its row -1); the row's length
        grows by T."""
        start, n = int(self.lengths[row]), len(tokens)
        if start + n > self.max_length:
            raise RuntimeError(f"a row would pass the model's context of {self.max_length} tokens")
        ids = np.asarray([tokens], np.int64)  # (1, T)
        positions = np.arange(start, start + n, dtype=np.int64)[None]  # (1, T)
        last = None if every_position else np.asarray([[n - 1]], np.int64)
        logits = self._run_prefill(ids, positions, np.asarray([start + n], np.int64), row, last)  # (1, T or 1, V)
        self.lengths[row] = start + n
        return logits[0]

    def fork(self, src: int, length: int) -> int:
        """A new active row (appended) holding the first `length` tokens of buffer row src. -> its row."""
        row = self.rows
        if row >= self.capacity:
            raise RuntimeError(f"KV cache holds {self.capacity} rows; all are active")
        self.copy_rows([(row, src)])
        self.lengths[row] = length
        self.rows += 1
        return row

    def copy_rows(self, moves: list[tuple[int, int]]) -> None:
        """(dst, src) whole-row copies; no row is both a source and a destination."""
        self._buffers()
        if self._copier is not None:
            self._copier.move(moves)
            return
        for buf in self._host_buffers():
            for dst, src in moves:
                buf[dst] = buf[src]

    def step(self, tokens: list[int]) -> np.ndarray:
        """One new token per active row (in row order) -> logits (B, V), valid until the next step."""
        rows = self.rows
        lengths = self.lengths[:rows]
        if int(lengths.max()) >= self.max_length:
            raise RuntimeError(f"a row would pass the model's context of {self.max_length} tokens")
        if self.device is None:
            ids = np.asarray(tokens, np.int64)[:, None]
            logits = self._run_plain(ids, lengths[:, None].copy(), lengths + 1, 0, None)[:, -1]
        else:
            logits = self._step_io(rows).run(tokens, lengths)
        self.lengths[:rows] += 1
        return logits

    def keep(self, rows: list[int]) -> list[int]:
        """Keeps these rows (ascending) as rows [0, n): a kept row below n stays where it is, and the
        places of the rows that left are taken by the kept rows at n and above (in order), so only
        those move. -> the new order: new row i holds old row order[i]."""
        n = len(rows)
        order = [r for r in rows if r < n]
        holes = sorted(set(range(n)) - set(order))  # places below n whose row left
        moves = list(zip(holes, [r for r in rows if r >= n]))  # (dst, src), dst < n <= src: no overlap
        order = list(range(n))
        for dst, src in moves:
            order[dst] = src
        if moves and self._copier is not None:
            self._copier.move(moves)
        elif moves:
            for buf in self._host_buffers():
                for dst, src in moves:
                    length = int(self.lengths[src])
                    buf[dst, :, :length] = buf[src, :, :length]
        for dst, src in moves:
            self.lengths[dst] = self.lengths[src]
        self.rows = n
        return order

    def reset(self) -> None:
        self.rows = 0
