"""Decoding: greedy and beam search over a `tokens_to_logits` callback (`decode.py`), the
beam layout of the decoder cache (`beam_cache.py`), text in / text out with a trained model
(`translate.py`) and decoding ops tuned for one backend (`cpu_workarounds.py`)."""
