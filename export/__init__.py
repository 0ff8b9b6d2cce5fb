"""Export: PyTorch models -> verified model directories, and the training that makes the models.

The only package of the project that imports torch. Its rooms follow the pipeline: `models/`
(PyTorch definitions), `convert/` (Hugging Face folders onto those models), `onnx/` (graphs and
their variants), `gate/` (parity against PyTorch), `build.py` + `modeldir.py` (a model directory
per kind, staged and published), `train/` (corpora, tokenizers, training, checkpoints); `cli.py`
and `__main__.py` are `python -m export`."""
