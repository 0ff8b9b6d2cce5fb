"""The parity gate: every exported graph against the PyTorch model that it came from, on the CPU
(parity.py) and, for fp16, on a CUDA GPU (gpu_gate.py); a miss raises `parity.ParityError`."""
