"""The 2017 Transformer (Vaswani et al., "Attention Is All You Need") in JAX/Flax."""
