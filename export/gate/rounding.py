"""How far float32 rounding alone may move a model's outputs: the gate's float32 limits, per model.

Two correct float32 evaluations of one model (PyTorch's and onnxruntime's, or one program on AVX2,
AVX-512/VNNI and AMX cores) differ because they sum their inner products in different orders
(8- or 16-lane FMA, other blocking, fused kernels). A fixed limit tuned on one CPU fails on another
(all-MiniLM-L6-v2's attention: 7.9e-6 on an AMD EPYC, 1.15e-5 on an Intel Xeon with AMX, against a
fixed 1e-5). So the limit is measured from the model itself: `rounding_noise` makes every
`nn.Linear` add to its output the error that float32 rounding may put on an inner product of its
length K, sqrt(K) * u * (|x| @ |W|^T) times a standard normal draw (u = 2^-24, float32's unit
roundoff; the probabilistic rounding-error bound of Higham & Mary, "A New Approach to Probabilistic
Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019), and the PyTorch reference runs once
more so. How far that moves an output carries the model's own depth, widths and magnitudes;
`float32_limit` allows twice it: two evaluations (PyTorch's and onnxruntime's) each erring by as
much. The bound sums |w x| where rounding errors mostly cancel, so it is pessimistic: MiniLM's
attention probabilities moved 2.4e-4 under the noise (limit 4.8e-4), while onnxruntime and PyTorch
differ by 7.9e-6 (AMD EPYC, AVX-512/VNNI) to 1.15e-5 (Intel Xeon, AMX); a real fault (a padded key
attended, a wrong scale) moves probabilities by 1e-2 and more.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2  # u = 2^-24: |fl(x) - x| <= u |x|
EVALUATIONS = 2  # the two evaluations compared (PyTorch's, onnxruntime's), each within the noise
SEED = 0  # the noise is drawn the same way at every export: the limit is reproducible


@contextmanager
def rounding_noise(model: nn.Module, seed: int = SEED) -> Iterator[None]:
    """Within: every nn.Linear of model perturbs its output by its float32 rounding bound (module doc)."""
    gen = torch.Generator().manual_seed(seed)

    def perturb(module: nn.Linear, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        bound = math.sqrt(module.in_features) * UNIT_ROUNDOFF * F.linear(inputs[0].abs(), module.weight.abs())
        noise = torch.randn(output.shape, generator=gen, dtype=output.dtype).to(output.device)
        return output + bound * noise

    handles = [m.register_forward_hook(perturb) for m in model.modules() if isinstance(m, nn.Linear)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def float32_limit(moved: float, scale: float = 1.0) -> float:
    """The largest difference float32 rounding allows, given how far rounding noise moved the outputs
    (`moved`) and their scale (at least one rounding of the output itself: u * scale)."""
    return EVALUATIONS * max(moved, UNIT_ROUNDOFF * scale)
