"""The team server: shared knowledge bases on PostgreSQL + pgvector, access checked before retrieval."""
