"""Decoding: greedy and beam search over a `tokens_to_logits` callback (`decode.py`), the
beam layout of the decoder cache (`beam_cache.py`), text in / text out with a trained model
(`translate.py`) and the ops whose fastest formulation depends on the backend, chosen here
rather than in the model (`backend_ops.py`)."""
