"""Fill-mask: BERT's masked-language-model head served (FillMaskService), on the embedding batcher."""

from service.fillmask.model import Candidate, FillMaskModel, FillResult

__all__ = ["Candidate", "FillMaskModel", "FillResult"]
