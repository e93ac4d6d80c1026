"""Search: greedy and sampling, batched beam search, and `generate` over files and data splits."""
