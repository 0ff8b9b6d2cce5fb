"""Numbers every door that reads wider values than the proto's shares: JSON (the HTTP door) and the
Open Inference Protocol's double parameters (service/kserve/) both fill 32-bit `float` fields."""

from __future__ import annotations

from service.errors import InvalidArgument

FLOAT32_ZERO = 2.0**-150  # a magnitude at or below this is 0 as a 32-bit float (the smallest one is 2**-149)


def float32(name: str, value: float) -> float:
    """value for a proto `float` field from a door that reads wider numbers (JSON, OIP's double
    parameters); INVALID_ARGUMENT when it is not 0 but a 32-bit float would hold it as 0: a
    temperature of 1e-50 became 0, greedy, instead of being refused as out of range."""
    if value != 0 and abs(value) <= FLOAT32_ZERO:
        raise InvalidArgument(
            f"{name}={value!r} is too small for the field's 32-bit float, which would read it as 0; "
            "send 0 or a value in the documented range"
        )
    return value
