"""The pydocs set through the battery's command line (``build.py`` holds the rules; see README.md).

    python evals/pydocs/make.py OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]

All 317 library pages and the same fixed sample of entries as ``build.py OUT`` by
default; ``--pages`` keeps a fixed sample of pages by a hash of their names.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from beirset import assemble, by_hash, cli
from build import ABSENT, CONCEPTS, DOCS, IDENTIFIERS, index_entries


def build(docs: Path, out: Path, *, pages: int | None, identifiers: int, concepts: int) -> dict:
    every = sorted(p.name for p in (docs / "library").glob("*.html"))
    return assemble(docs / "library", out, sorted(by_hash(every, pages)), index_entries(docs), ABSENT,
                    identifiers=identifiers, concepts=concepts)


if __name__ == "__main__":
    cli(__doc__, build, DOCS, "genindex-all.html", "python3.11-doc", pages=None,
        identifiers=IDENTIFIERS, concepts=CONCEPTS)
