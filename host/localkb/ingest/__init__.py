"""From a document to stored passages: extraction, chunking, the ingest pipeline, and re-embedding."""
