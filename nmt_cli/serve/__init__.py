"""`nmt serve`: translation over HTTP, batching sentences across requests (needs the `nmt[serve]` extra)."""
