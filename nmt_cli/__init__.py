"""nmt: the Transformer of "Attention Is All You Need", behind one command line."""

__version__ = "0.1.0"
