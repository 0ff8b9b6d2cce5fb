"""An HTTP request's body as a JSON object: bounded in size, time and nesting; a client that leaves
before sending all of it is CANCELLED. Every POST route reads its body here.

- size: `max_message_bytes`, the gRPC message limit, refused as soon as the body passes it;
- time: the whole body within `http_body_timeout_s`, else 408 with the connection closed;
- nesting: at most MAX_JSON_DEPTH levels (Python's json module recurses per level, so a deep body
  would raise RecursionError); a deeper body gets 400 naming the limit, whether the parser gave up
  first or the byte scan after it (`too_deep`) found it;
- a client gone mid-body (starlette's ClientDisconnect) is `Cancelled`: CANCELLED, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import re

from starlette.requests import ClientDisconnect, Request

from service.errors import Cancelled, InvalidArgument
from service.http.errors import SlowBody

MAX_JSON_DEPTH = 32  # nesting of arrays and objects in a body
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_PAIRS = re.compile(rb"\[\]|\{\}")  # one left-to-right pass removes exactly the innermost pairs
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
TOO_DEEP = f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels, this server's limit"


async def read_json(request: Request, max_bytes: int, timeout_s: float) -> dict:
    body = await read_body(request, max_bytes, timeout_s)
    try:
        value = json.loads(body)
    except RecursionError as e:  # Python's parser nests once per level; past its limit it gives up
        raise InvalidArgument(TOO_DEEP) from e
    except ValueError as e:
        raise InvalidArgument(f"the body is not JSON ({e})") from e
    if too_deep(body, MAX_JSON_DEPTH):
        raise InvalidArgument(TOO_DEEP)
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


def too_deep(body: bytes, limit: int) -> bool:
    """The arrays and objects of a valid JSON body nest deeper than limit."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = _STRINGS.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        brackets = _PAIRS.sub(b"", brackets)
        if not brackets:
            return False
    return True
