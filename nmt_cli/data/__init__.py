"""Text in, memory-mapped token ids and token-budget batches out."""
