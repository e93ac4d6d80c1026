"""The Transformer of Vaswani et al. (2017): attention, layers, and the encoder-decoder."""
