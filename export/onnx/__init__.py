"""PyTorch models -> ONNX graphs: the serving graphs (graphs.py), their optimized / fp16 / int8
variants (graphs.py, quantize.py), the packed encoder graphs (packed.py), the fill-mask graph
(fill_mask.py) and the inspection graphs of attention probabilities (attention.py)."""
