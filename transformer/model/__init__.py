"""The model: the Transformer of §3 in flax.linen (`transformer.py`) and its multi-head
attention with the decoder's key/value cache (`attention.py`). Knows nothing of data,
decoding strategies, training or any backend."""
