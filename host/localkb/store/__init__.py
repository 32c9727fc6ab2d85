"""The local store: the SQLite catalogue, the store lock and ``open_kb``, and the derived
indexes (usearch vectors, Whoosh keywords)."""
