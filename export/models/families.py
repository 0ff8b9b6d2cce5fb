"""The model families behind each encoder kind, for the graphs and gates that take any of them.

BERT's (encoder.py, mlm.py, classifier.py) and ModernBERT's (modernbert.py) offer the graphs the
same methods: `padded_hidden` and `packed_hidden` (token states of padded or packed rows), `pool`
(an embedding model's), `head(hidden, embedding_weight)` (a masked LM's), `classify` and
`classify_packed` (a classifier's), and the same config fields (`vocab_size`, `d_model`,
`n_heads`, `pad_token_id`, `pooling`, `max_length`).
"""

from __future__ import annotations

from export.models.classifier import SequenceClassifier
from export.models.encoder import SentenceEncoder
from export.models.mlm import MaskedLM
from export.models.modernbert import ModernBertClassifier, ModernBertEncoder, ModernBertMaskedLM

Encoder = SentenceEncoder | ModernBertEncoder
MLM = MaskedLM | ModernBertMaskedLM
Classifier = SequenceClassifier | ModernBertClassifier
