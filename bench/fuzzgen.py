"""Random requests for every RPC of the public contract, built from the proto descriptors.

Shared by the property test (tests/service/test_service_fuzz.py) and bench/fuzz.py. Nothing here names an
RPC or a field: it walks `inference_pb2.DESCRIPTOR`, so a new RPC or field is fuzzed the day it
lands in the proto. `rpcs()` lists the methods; `calls(known)` is a hypothesis strategy of
`(Rpc, payload)` (`known`: strings worth drawing often, the served model names);
`Client(address).invoke(rpc, payload, timeout)` sends it through generic multi-callables and
returns (status code, details); `draw(strategy, n, seed)` draws without a test runner. Values
reach the edges: strings from every Unicode plane, control characters and huge texts, integers at
their limits, NaN / inf / subnormal floats, repeated fields beyond any limit the service sets.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Literal

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from service.proto import inference_pb2

MAX_DEPTH = 3  # nested messages
INT_RANGES = {
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2**64 - 1),
}
SPECIAL_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e-45,
    1e-30,
    1e-7,
    1e9,
    -1e9,
    1e30,
    3.4e38,
    -3.4e38,
    float("nan"),
    float("inf"),
    float("-inf"),
]
ODD_CHARS = "\x00\x01\x07\x08\t\n\r\x1b\x7f\x85\xa0\u200b\u200e\u202e\u2028\u2029\ufeff\ufffd\uffff\U0010ffff"
BEYOND = [16, 17, 255, 256, 257, 1000, 5000]  # repeated sizes around and past the limits services set
MASKED = ["the [MASK] sat", "[MASK]", "[MASK] [MASK] [MASK]", "[mask] [MASK", "x" * 40 + " [MASK]"]  # FillMask's inputs


@dataclasses.dataclass(frozen=True)
class Rpc:
    service: str  # full name, e.g. inference.v1.EmbeddingService
    method: str
    request: type[Message]
    response: type[Message]
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"

    @property
    def name(self) -> str:
        return f"{self.service.rsplit('.', 1)[-1]}/{self.method}"


def rpcs(file=inference_pb2.DESCRIPTOR) -> list[Rpc]:
    """Every method of every service in the proto file, in declaration order."""
    return [
        Rpc(
            s.full_name,
            m.name,
            message_factory.GetMessageClass(m.input_type),
            message_factory.GetMessageClass(m.output_type),
            m.client_streaming,
            m.server_streaming,
        )
        for s in file.services_by_name.values()
        for m in s.methods
    ]


def strings(known: Sequence[str]) -> st.SearchStrategy[str]:
    unicode = st.characters(exclude_categories=["Cs"])  # every plane; lone surrogates are not UTF-8
    huge = st.builds(lambda c, n: c * n, unicode, st.integers(1_000, 200_000))
    branches = [
        st.just(""),
        st.text(unicode, max_size=40),
        st.text(st.sampled_from(ODD_CHARS), max_size=20),
        st.text(st.characters(codec="ascii"), min_size=1, max_size=60),
        huge,
        st.sampled_from(MASKED),
    ]
    if known:
        branches += [st.sampled_from(list(known))] * 4  # most calls should get past the model lookup
    return st.one_of(branches)


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in (lo, lo + 1, hi - 1, hi, 0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1) if lo <= v <= hi})
    return st.one_of(
        st.integers(max(lo, 0), min(hi, 8)),
        st.integers(max(lo, 0), min(hi, 300)),
        st.sampled_from(edges),
        st.integers(lo, hi),
    )


def floats(width: Literal[32, 64]) -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from(SPECIAL_FLOATS), st.floats(0.0, 2.0, width=width), st.floats(width=width, allow_subnormal=True)
    )


def scalar(field: FieldDescriptor, known: Sequence[str], depth: int) -> st.SearchStrategy:
    """Values for one (non-repeated) element of a field."""
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        if field.type == FieldDescriptor.TYPE_BYTES:
            return st.binary(max_size=64)
        return strings(known)
    if cpp in INT_RANGES:
        return integers(*INT_RANGES[cpp])
    if cpp == FieldDescriptor.CPPTYPE_FLOAT:
        return floats(32)
    if cpp == FieldDescriptor.CPPTYPE_DOUBLE:
        return floats(64)
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return st.booleans()
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-3, 1000))  # proto3 enums are open
    return messages(field.message_type, known, depth + 1)


def repeated(element: st.SearchStrategy, short: st.SearchStrategy) -> st.SearchStrategy[list]:
    """0-4 items of any kind, or a count around / beyond the service limits of short items."""
    return st.one_of(
        st.lists(element, max_size=4),
        st.sampled_from(BEYOND).flatmap(lambda n: st.lists(short, min_size=n, max_size=n)),
    )


def field_values(field: FieldDescriptor, known: Sequence[str], depth: int) -> st.SearchStrategy:
    """A value for `field` as a message constructor keyword takes it; None leaves the field unset."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return st.dictionaries(scalar(key, known, depth), scalar(value, known, depth), max_size=4)
    element = scalar(field, known, depth)
    if field.is_repeated:
        short = {FieldDescriptor.CPPTYPE_STRING: st.sampled_from(["x", "hello world", "a [MASK] b", *known])}
        lists = repeated(element, short.get(field.cpp_type, element))
        if field.cpp_type == FieldDescriptor.CPPTYPE_STRING and field.type != FieldDescriptor.TYPE_BYTES:
            lists |= st.lists(st.sampled_from(MASKED), min_size=1, max_size=4)  # all masked: FillMask computes
        return lists
    return st.one_of(st.none(), element)


def messages(descriptor: Descriptor, known: Sequence[str] = (), depth: int = 0) -> st.SearchStrategy:
    """Instances of the message type, every field drawn (nested messages up to MAX_DEPTH)."""
    cls = message_factory.GetMessageClass(descriptor)
    fields = [f for f in descriptor.fields if depth < MAX_DEPTH or f.message_type is None]
    values = st.fixed_dictionaries({f.name: field_values(f, known, depth) for f in fields})
    return values.map(lambda kw: cls(**{k: v for k, v in kw.items() if v is not None}))


def calls(known: Sequence[str] = (), only: Sequence[Rpc] | None = None) -> st.SearchStrategy[tuple[Rpc, object]]:
    """(rpc, payload) for every RPC (or those in `only`); payload is a list for client streams."""

    def payloads(rpc: Rpc) -> st.SearchStrategy:
        one = messages(rpc.request.DESCRIPTOR, known)
        return (st.lists(one, max_size=5) if rpc.client_streaming else one).map(lambda p: (rpc, p))

    return st.sampled_from(list(only or rpcs())).flatmap(payloads)


class Client:
    """Channels to one server that call any `Rpc` generically (no stubs) and read every response.

    Client-streaming calls go through the synchronous API in a thread: when a server ends such a
    call early (e.g. INVALID_ARGUMENT on the first message) while the client is still writing,
    grpc.aio's client reports INTERNAL "Internal error from Core" instead of the server's status
    (grpc/grpc#36066), which would hide what the server said. The synchronous API reports it.
    """

    OPTIONS = (("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", 64 << 20))

    def __init__(self, address: str):
        self.aio = grpc.aio.insecure_channel(address, options=self.OPTIONS)
        self.sync = grpc.insecure_channel(address, options=self.OPTIONS)

    async def close(self) -> None:
        await self.aio.close()
        self.sync.close()

    async def invoke(self, rpc: Rpc, payload, timeout: float) -> tuple[grpc.StatusCode, str]:
        """Sends one call and reads all of its responses -> (status code, details; "" when OK)."""
        codec = dict(request_serializer=rpc.request.SerializeToString, response_deserializer=rpc.response.FromString)
        try:
            if rpc.client_streaming:
                await asyncio.to_thread(self._stream_sync, rpc, codec, payload, timeout)
            elif rpc.server_streaming:
                async for _ in self.aio.unary_stream(rpc.path, **codec)(payload, timeout=timeout):
                    pass
            else:
                await self.aio.unary_unary(rpc.path, **codec)(payload, timeout=timeout)
        except grpc.RpcError as e:  # grpc.aio.AioRpcError is one too
            return e.code(), e.details() or ""
        return grpc.StatusCode.OK, ""

    def _stream_sync(self, rpc: Rpc, codec: dict, payload: list, timeout: float) -> None:
        if rpc.server_streaming:
            for _ in self.sync.stream_stream(rpc.path, **codec)(iter(payload), timeout=timeout):
                pass
        else:
            self.sync.stream_unary(rpc.path, **codec)(iter(payload), timeout=timeout)


def draw(strategy: st.SearchStrategy, n: int, at: int = 0) -> list:
    """n examples of strategy, reproducible from `at` (hypothesis's generator, no test runner)."""
    out: list = []

    @seed(at)
    @settings(
        max_examples=n, phases=[Phase.generate], database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(strategy)
    def collect(example) -> None:
        out.append(example)

    collect()
    return out
