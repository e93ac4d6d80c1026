"""Model export: `nmt export` writes a checkpoint in a serving format (CTranslate2)."""
