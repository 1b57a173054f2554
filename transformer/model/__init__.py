"""The model: the Transformer of §3 in flax.linen (`transformer.py`), its layers
(`layers.py`), its multi-head attention with the decoder's key/value cache (`attention.py`),
the position schemes (`position_schemes.py`, one registered object each; their mathematics in
`positions.py`) and the hyperparameters (`config.py`). Knows nothing of
data, decoding strategies, training or any backend."""
