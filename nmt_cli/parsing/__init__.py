"""English constituency parsing as translation (paper section 6.3): trees, linearisation, the tree constraint, EVALB."""
