"""The pgdocs set through the battery's command line (``build.py`` holds the rules; see README.md).

    python evals/pgdocs/make.py OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]

All pages and every judged entry by default, as ``build.py OUT`` builds them; ``--pages``
keeps a fixed sample of pages by a hash of their names (the battery's).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from beirset import assemble, by_hash, cli
from build import ABSENT, MANUAL, index_entries


def build(docs: Path, out: Path, *, pages: int | None, identifiers: int | None,
          concepts: int | None) -> dict:
    every = sorted(p.name for p in docs.glob("*.html") if p.name != "bookindex.html")
    return assemble(docs, out, sorted(by_hash(every, pages)), index_entries(docs), ABSENT,
                    identifiers=identifiers, concepts=concepts)


if __name__ == "__main__":
    cli(__doc__, build, MANUAL, "bookindex.html", "postgresql-doc-15", pages=None, identifiers=None,
        concepts=None)
