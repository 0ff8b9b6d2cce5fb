"""The KServe v2 REST tensor codec (service/kserve/tensors.py) against tritonclient.http's own encoder and decoder.

Request bodies come from `InferenceServerClient.generate_request_body` (what `infer` sends), response
bodies are read back with `InferenceServerClient.parse_response_body` (what `infer` returns): every
datatype, binary and JSON, flat and nested data, BYTES with empty and non-ASCII elements. Property
tests (hypothesis) feed both bindings' decoders any request: decoded, or InvalidArgument naming what.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import tritonclient.http as triton
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor

from service.errors import InvalidArgument
from service.kserve import arrays, converters, tensors
from service.proto import open_inference_grpc_pb2 as oip

Client = triton.InferenceServerClient
RNG = np.random.default_rng(0)
MOST = 16 << 20  # elements a tensor may hold: the default max_message_bytes
TEXTS = np.array([b"hello", b"", "é ü 漢字".encode(), b"\x00zero inside"], dtype=np.object_).reshape(2, 2)
NUMERIC = {  # one array per datatype the protocol names, with extremes
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([0, 255], dtype=np.uint8),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "UINT32": np.array([0, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 127], dtype=np.int8),
    "INT16": np.array([-(2**15), 2**15 - 1], dtype=np.int16),
    "INT32": np.array([[-(2**31)], [2**31 - 1]], dtype=np.int32),
    "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "FP16": np.array([0.5, -65504.0], dtype=np.float16),
    "FP32": RNG.standard_normal((3, 4)).astype(np.float32),
    "FP64": RNG.standard_normal(5),
}


def triton_input(name: str, array: np.ndarray, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    return tensor.set_data_from_numpy(array, binary_data=binary)


def decode(inputs, outputs=None, **kwargs) -> tensors.InferRequest:
    body, json_size = Client.generate_request_body(inputs, outputs=outputs, **kwargs)
    return tensors.decode_request(body, None if json_size is None else str(json_size), MOST)


def test_the_datatype_table_is_tritons():
    for datatype, dtype in tensors.DATATYPES.items():
        assert np_to_triton_dtype(dtype) == datatype


@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_decodes_as_sent(binary):
    arrays = {"text": TEXTS, **NUMERIC}
    request = decode([triton_input(name, array, binary) for name, array in arrays.items()])
    assert [t.name for t in request.inputs] == list(arrays)
    for tensor, (name, array) in zip(request.inputs, arrays.items(), strict=True):
        assert tensor.datatype == np_to_triton_dtype(array.dtype)
        assert tensor.array.shape == array.shape and tensor.array.dtype == tensors.DATATYPES[tensor.datatype]
        assert tensor.array.tolist() == array.tolist(), name


def test_request_id_parameters_and_requested_outputs():
    outputs = [triton.InferRequestedOutput("a"), triton.InferRequestedOutput("b", binary_data=False)]
    request = decode(
        [triton_input("text", TEXTS, True)],
        outputs,
        request_id="r-7",
        parameters={"temperature": 0.5, "seed": 3, "stop": "\n", "normalize": True},
    )
    assert request.id == "r-7"
    assert request.parameters == {"temperature": 0.5, "seed": 3, "stop": "\n", "normalize": True}
    assert request.outputs == {"a": True, "b": False} and not request.binary_output
    everything = decode([triton_input("text", TEXTS, True)])  # no outputs named: tritonclient asks binary
    assert everything.outputs == {} and everything.binary_output and everything.parameters == {}


def test_nested_and_flat_json_data_are_the_same_tensor():
    flat = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}]}
    nested = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}
    a, b = (tensors.decode_request(json.dumps(body).encode(), None, MOST).inputs[0].array for body in (flat, nested))
    assert a.tolist() == b.tolist() == [[1, 2], [3, 4]]


def test_bytes_layout_is_tritons():
    elements = list(TEXTS.flat)
    assert tensors.pack_bytes(elements) == serialize_byte_tensor(TEXTS).item()
    assert arrays.split_bytes(tensors.pack_bytes(elements), "x") == elements
    assert list(deserialize_bytes_tensor(tensors.pack_bytes(["a", "bc"]))) == [b"a", b"bc"]


def result_of(outputs: list[tensors.Tensor], request: tensors.InferRequest, parameters=None):
    body, header_length = tensors.encode_response("m", "1", request, outputs, parameters or {})
    return Client.parse_response_body(body, header_length=header_length), body, header_length


@pytest.mark.parametrize("binary", [True, False])
def test_every_datatype_reads_back_through_tritonclient(binary):
    arrays = {"text": TEXTS, **NUMERIC}
    outputs = [tensors.Tensor(n, np_to_triton_dtype(a.dtype), a) for n, a in arrays.items()]
    request = tensors.InferRequest(inputs=[], binary_output=binary, id="q")
    result, _, header_length = result_of(outputs, request, {"input_tokens": 7})
    assert (header_length is not None) == binary
    response = result.get_response()
    assert response["model_name"] == "m" and response["id"] == "q" and response["parameters"]["input_tokens"] == 7
    for name, array in arrays.items():
        got = result.as_numpy(name)
        if name == "text" and not binary:  # tritonclient reads JSON BYTES as str
            got = np.vectorize(str.encode, otypes=[object])(got)
        assert got.shape == array.shape and got.tolist() == array.tolist(), name


def test_binary_and_json_outputs_mix_per_requested_output():
    outputs = [tensors.Tensor("score", "FP32", np.arange(3, dtype=np.float32)), tensors.Tensor("text", "BYTES", TEXTS)]
    request = tensors.InferRequest(inputs=[], outputs={"score": False, "text": True})
    result, body, header_length = result_of(outputs, request)
    header = json.loads(body[:header_length])
    assert header["outputs"][0]["data"] == [0.0, 1.0, 2.0] and "data" not in header["outputs"][1]
    assert result.as_numpy("score").tolist() == [0.0, 1.0, 2.0] and result.as_numpy("text").tolist() == TEXTS.tolist()


def test_json_only_response_has_no_header_length():
    request = tensors.InferRequest(inputs=[])
    result, body, header_length = result_of([tensors.Tensor("t", "BYTES", np.array([b"a"], dtype=object))], request)
    assert header_length is None and json.loads(body)["outputs"][0]["data"] == ["a"]
    assert result.as_numpy("t").tolist() == ["a"]


def body(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def text(**fields) -> dict:
    return {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"], **fields}


BAD = [
    (b"[1]", None, "must be a JSON object"),
    (b"{", None, "JSON is not valid"),
    (body(), None, "inputs must be a non-empty array"),
    (body(text(datatype="STRING")), None, "inputs[0] ('text').datatype='STRING' is not one of"),
    (body(text(shape=[-1])), None, "inputs[0] ('text').shape=[-1] must be an array of non-negative"),
    (body(text(shape=[2])), None, "shape=[2] holds 2 elements but its data 1"),
    (body(text(data=[1])), None, "BYTES elements must be JSON strings"),
    (body(text(datatype="INT8", data=[300])), None, "elements must be numbers that fit INT8"),
    (body(text(datatype="INT32", data=[1.5])), None, "elements must be numbers that fit INT32"),
    (body(text(datatype="BOOL", data=[1])), None, "elements must be true or false"),
    (body(text(datatype="FP16", data=[1e6])), None, "too large for FP16"),
    (body(text(datatype="FP32", data=[10**400])), None, "too large for FP32"),  # beyond float64: OverflowError
    (body(text(datatype="FP64", data=[-(10**400)])), None, "too large for FP64"),
    (body(text(data=["\ud800"])), None, "inputs[0] ('text').data[0] is not valid Unicode"),
    (body(text(), id="\ud800"), None, "id is not valid Unicode"),
    (body(text(), parameters={"stop": "\udfff"}), None, "parameters.stop is not valid Unicode"),
    (body(text(shape=[0] * 65, data=[])), None, "inputs[0] ('text').shape must be an array of at most 64"),
    (body(text(shape=[2**62] * 64)), None, "holds more than 16777216 elements"),
    (body(text()), "\u00b2", "Inference-Header-Content-Length='²'"),
    (body(text(data=None, parameters={"shared_memory_region": "r"})), None, "shared memory is not supported"),
    (body({"name": "text", "datatype": "BYTES", "shape": [1]}), None, "neither data nor"),
    (body(text(), parameters={"binary_data_output": "yes"}), None, "binary_data_output='yes' must be true"),
    (body(text(), parameters={"p": [1]}), None, "parameters.p must be a string, number or boolean"),
    (body(text(), outputs=[{"name": "o", "parameters": {"classification": 2}}]), None, "classification"),
    (body(text(), id=5), None, "id must be a string"),
    (body(text()), "0", "Inference-Header-Content-Length='0'"),
    (body(text()), "99999", "Inference-Header-Content-Length='99999'"),
    (body(text()) + b"xx", "len", "2 bytes of binary data follow the JSON"),
    (
        body(text(data=None, parameters={"binary_data_size": 9})) + b"\x01\x00\x00\x00a",
        "len",
        "binary_data_size=9 must be the size",
    ),
    (
        body(text(data=None, parameters={"binary_data_size": 6})) + b"\x05\x00\x00\x00ab",
        "len",
        "raw BYTES content is cut: an element of 5 bytes",
    ),
    (
        body(text(datatype="FP32", data=None, parameters={"binary_data_size": 3})) + b"abc",
        "len",
        "FP32 needs 4 bytes but its binary_data_size is 3",
    ),
]


@pytest.mark.parametrize("raw, header_length, message", BAD)
def test_bad_requests_name_the_field(raw, header_length, message):
    if header_length == "len":  # the JSON's own size, binary data after it
        header_length = str(raw.index(b"}]}") + 3 if b"}]}" in raw else len(raw))
    with pytest.raises(InvalidArgument) as caught:
        tensors.decode_request(raw, header_length, MOST)
    assert message in caught.value.message


def test_deep_json_is_refused_not_recursed():
    with pytest.raises(InvalidArgument, match="nests arrays and objects deeper"):
        tensors.decode_request(b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, MOST)


ODD_TEXT = st.text(
    st.sampled_from(["a", "\ud800", "²", "٣", "[", '"', "\\", " "]), max_size=6
)  # lone surrogate included
INTEGERS = st.integers(-(2**70), 2**70) | st.sampled_from([10**400, -(10**400), 2**64, 2**63, -1])
SCALAR = st.none() | st.booleans() | INTEGERS | st.floats() | ODD_TEXT
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ODD_TEXT, inner, max_size=3),
    max_leaves=12,
)
SHAPE = st.lists(st.sampled_from([0, 1, 2, 3, -1, 2**40, 2**62, 2**64]), max_size=70) | JSON


@st.composite
def fitting(draw) -> dict:
    """An input whose data holds as many elements as its shape: decoding reaches the elements."""
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    elements = draw(st.sampled_from([INTEGERS, st.floats(), ODD_TEXT, st.booleans(), SCALAR]))  # mostly of one kind
    data = draw(st.lists(elements, min_size=math.prod(shape), max_size=math.prod(shape)))
    return {"name": "text", "datatype": draw(st.sampled_from(list(tensors.DATATYPES))), "shape": shape, "data": data}


INPUT = fitting() | st.fixed_dictionaries(
    {"name": ODD_TEXT | JSON, "datatype": st.sampled_from([*tensors.DATATYPES, "STRING"]), "shape": SHAPE},
    optional={"data": JSON, "parameters": st.dictionaries(ODD_TEXT, JSON, max_size=2) | JSON},
)
REQUEST = st.fixed_dictionaries(
    {"inputs": st.lists(INPUT, max_size=3) | JSON},
    optional={"id": ODD_TEXT | JSON, "parameters": JSON, "outputs": st.lists(JSON, max_size=2)},
)


@settings(max_examples=400, deadline=None)
@given(REQUEST, st.binary(max_size=16), st.one_of(st.none(), ODD_TEXT, st.just("len")))
def test_any_request_decodes_or_is_refused_naming_what(request, tail, header_length):
    """Whatever the JSON holds (lone surrogates, huge integers, 70-dim shapes, wrong types), decoding
    returns a request or raises InvalidArgument: never another exception (a 500)."""
    header = json.dumps(request).encode()
    size = str(len(header)) if header_length == "len" else header_length
    try:
        decoded = tensors.decode_request(header + tail, size, MOST)
    except InvalidArgument as e:
        assert e.message
        return
    for tensor in decoded.inputs:
        assert tensor.array.size == math.prod(tensor.shape)


@st.composite
def grpc_request(draw) -> oip.ModelInferRequest:
    """A ModelInferRequest of any inputs: typed contents or raw bytes, shapes up to 70 dimensions."""
    request, raw = oip.ModelInferRequest(), draw(st.booleans())
    for _ in range(draw(st.integers(0, 2))):
        shape = draw(st.lists(st.sampled_from([0, 1, 2, 3, -1, 2**40, 2**62]), max_size=70))
        datatype = draw(st.sampled_from([*tensors.DATATYPES, "STRING"]))
        tensor = request.inputs.add(name=draw(st.text(max_size=4)), datatype=datatype, shape=shape)
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=24)))
        else:
            tensor.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=4), max_size=4)))
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=4)))
            tensor.contents.int_contents.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4)))
    return request


@settings(max_examples=300, deadline=None)
@given(grpc_request())
def test_any_grpc_request_decodes_or_is_refused_naming_what(request):
    try:
        decoded = converters.input_tensors(request, MOST)
    except InvalidArgument as e:
        assert e.message
        return
    assert [t.name for t in decoded] == [t.name for t in request.inputs]
