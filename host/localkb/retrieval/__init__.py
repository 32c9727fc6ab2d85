"""Search: per-knowledge-base hybrid retrieval with statuses, rank fusion, and the eval runner."""
