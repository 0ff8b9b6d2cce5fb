"""What the per-kind cores share. A core (`service/<kind>/core.py`) takes a dataclass query and a deadline
(a `time.monotonic()` instant or None) and returns a dataclass of plain values and numpy arrays, never
protobuf or JSON, so it could run in another process; it validates (one place per rule, errors from
service/errors.py), resolves the model, and the model admits the call (service/admission.py) before
any work. The doors only convert (docs/design/request-paths.md); service/cores.py builds the cores.
"""

from __future__ import annotations

from service.errors import InvalidArgument


def check_inputs(inputs: list[str], limit: int, what: str, *, blank_ok: bool, split: str = "split the call") -> None:
    """The rules every list of input texts follows: not empty, at most `limit`, no empty text; each kind
    states whether a blank (whitespace-only) text is one: `blank_ok` (embedding, fill-mask: the model
    reads its special tokens) or refused like "" (translation). `what` ends the messages ("text to
    embed"), `split` is the advice for too many."""
    if not inputs:
        raise InvalidArgument(f"inputs is empty; send at least one {what}")
    if len(inputs) > limit:
        raise InvalidArgument(f"{len(inputs)} inputs in one call; the limit is {limit}: {split}")
    for i, text in enumerate(inputs):
        if not text or not (blank_ok or text.strip()):
            raise InvalidArgument(f"inputs[{i}] is empty; every input must contain text")
