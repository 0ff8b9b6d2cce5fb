"""An HTTP request's body as a JSON object: bounded in size, time and nesting; a client that leaves
before sending all of it is CANCELLED. Every POST route reads its body here.

- size: `max_message_bytes`, the gRPC message limit, refused as soon as the body passes it;
- time: the whole body within `http_body_timeout_s`, else 408 with the connection closed;
- structure: at most MAX_JSON_DEPTH levels of nesting (Python's json module recurses per level, so
  a deep body would raise RecursionError) and MAX_JSON_VALUES values (the parser builds a Python
  object per value, holding the GIL: 15 MB of `[],` took seconds): a body over either gets 400
  naming the limit from one scan of its bytes before it is parsed (`check_structure`: strings cut
  out by one regex, brackets and commas kept, the running depth summed by numpy; linear, C speed);
- a client gone mid-body (starlette's ClientDisconnect) is `Cancelled`: CANCELLED, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
from starlette.requests import ClientDisconnect, Request

from service.errors import Cancelled, InvalidArgument
from service.http.errors import SlowBody

MAX_JSON_DEPTH = 32  # nesting of arrays and objects in a body
MAX_JSON_VALUES = 1 << 20  # values in a body: 256 prompts of 4,096 token ids; a 1M-token detokenize
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b"[]{},")
TOO_DEEP = f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels, this server's limit"
TOO_MANY = f"the body holds over {MAX_JSON_VALUES} values (array elements and object members), this server's limit"


async def read_json(request: Request, max_bytes: int, timeout_s: float) -> dict:
    body = await read_body(request, max_bytes, timeout_s)
    check_structure(body)
    try:
        value = json.loads(body)
    except RecursionError as e:  # Python's parser nests once per level (the scan bounds it: defensive)
        raise InvalidArgument(TOO_DEEP) from e
    except ValueError as e:
        raise InvalidArgument(f"the body is not JSON ({e})") from e
    if not isinstance(value, dict):
        raise InvalidArgument("the body must be a JSON object")
    return value


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    parts, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for part in request.stream():  # refused once past the limit, not after reading it all
                size += len(part)
                if size > max_bytes:
                    raise InvalidArgument(
                        f"request body over {max_bytes} bytes (--max-message-bytes); send less per call"
                    )
                parts.append(part)
    except ClientDisconnect as e:
        raise Cancelled(f"the client closed the connection after {size} bytes of the body") from e
    except TimeoutError as e:  # this timeout's own: the call's X-Request-Timeout is the route's, outside
        raise SlowBody(
            f"the body did not arrive within {timeout_s:g} s (http_body_timeout_s; {size} bytes came); send it at once"
        ) from e
    return b"".join(parts)


def check_structure(body: bytes) -> None:
    """InvalidArgument (TOO_DEEP, TOO_MANY) when the body's arrays and objects nest deeper than
    MAX_JSON_DEPTH or hold more than MAX_JSON_VALUES values, found before it is parsed. Of a body that
    is not JSON: its brackets outside strings open more than that deep, or it has that many commas."""
    opens, commas = body.count(b"[") + body.count(b"{"), body.count(b",")
    if opens <= MAX_JSON_DEPTH and opens + commas < MAX_JSON_VALUES:
        return  # strings can only have added to either count
    strings = (body.count(b'"') - body.count(b'\\"')) // 2  # at least: an escaped quote has a backslash
    if strings // 2 >= MAX_JSON_VALUES:  # a value per string, or a member per two (key and value): known
        raise InvalidArgument(TOO_MANY)  # without cutting each out (a regex match a string: seconds for millions)
    marks = np.frombuffer(_STRINGS.sub(b"", body).translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    opening = (marks == ord("[")) | (marks == ord("{"))
    if int(np.count_nonzero(opening)) + int(np.count_nonzero(marks == ord(","))) >= MAX_JSON_VALUES:
        raise InvalidArgument(TOO_MANY)
    steps = opening[marks != ord(",")].astype(np.int8) * 2 - 1  # +1 per opening bracket, -1 per closing
    depth = np.cumsum(steps, dtype=np.int32)
    if len(depth) and int(depth.max()) > MAX_JSON_DEPTH:
        raise InvalidArgument(TOO_DEEP)
