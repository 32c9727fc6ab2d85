"""Build a BEIR-layout eval set from Python 3.11's library reference, judged by its own index.

    python evals/pydocs/build.py OUT [--docs DIR] [--identifiers N] [--concepts N]

The issue's own scenario (317 HTML pages of the library reference, saved as a user would),
with relevance from the authors, never from LocalKB: Sphinx's general index
(``genindex-all.html``) links every documented name to the page that documents it
(``library/asyncio-task.html#asyncio.Task.done``). Such a name, fully qualified as the
anchor spells it, is an ``identifier`` query whose relevant pages are those its anchors
point into; an index entry of words (``hash-based message authentication`` →
``library/hmac.html#index-0``) is a ``concept`` query. Only links into ``library/`` count.
A fixed sample of each kind (by a hash of the text) keeps a run to minutes; one query in
three goes to dev (rules are chosen there), the others to test.

``kind: absent``: names of later Python releases, other libraries, and typos of real
names, each checked against every page (any case, parts joined any way) and dropped,
loudly, if found.

The docs are Debian's ``python3.11-doc`` (``/usr/share/doc/python3.11/html``), under the
PSF licence (``license.html`` in it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from beirset import stable_hash, truly_absent, write_set

DOCS = Path("/usr/share/doc/python3.11/html")
IDENTIFIERS = 600
CONCEPTS = 200
_LINK = re.compile(r"library/([\w.-]+\.html)#(.+)")
_QUALIFIED = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+")

#: Names that are not in Python 3.11's library reference, with where they come from.
ABSENT = {
    "pathlib.Path.walk": "Python 3.12",
    "itertools.batched": "Python 3.12",
    "math.sumprod": "Python 3.12",
    "typing.override": "Python 3.12",
    "sys.monitoring": "Python 3.12",
    "os.path.splitroot": "Python 3.12",
    "calendar.Month": "Python 3.12",
    "sqlite3.Connection.autocommit": "Python 3.12",
    "tomllib.dumps": "never in tomllib (reading only)",
    "copy.replace": "Python 3.13",
    "warnings.deprecated": "Python 3.13",
    "PYTHON_GIL": "Python 3.13 environment variable",
    "PYTHON_BASIC_REPL": "Python 3.13 environment variable",
    "asyncio.Queue.shutdown": "Python 3.13",
    "numpy.einsum": "NumPy",
    "pandas.DataFrame.merge": "pandas",
    "requests.Session.mount": "requests",
    "django.db.models.Q": "Django",
    "torch.nn.Module": "PyTorch",
    "flask.Blueprint": "Flask",
    "pydantic.BaseModel": "pydantic",
    "attrs.define": "attrs",
    "asyncio.TaskGroup.cancel_all": "typo/invention on asyncio.TaskGroup",
    "json.dumpz": "typo of json.dumps",
    "os.makedirz": "typo of os.makedirs",
    "collections.OrderDict": "typo of collections.OrderedDict",
    "subprocess.check_ouput": "typo of subprocess.check_output",
    "itertools.permutaions": "typo of itertools.permutations",
    "functools.lru_cahce": "typo of functools.lru_cache",
    "datetime.datetime.fromisoformatt": "typo of datetime.datetime.fromisoformat",
    "shutil.copytre": "typo of shutil.copytree",
    "logging.getLoger": "typo of logging.getLogger",
    "re.fullmach": "typo of re.fullmatch",
}


def _plain(path: Path) -> str:
    import lxml.html

    tree = lxml.html.fromstring(path.read_bytes())
    body = tree.find("body")
    return re.sub(r"\s+", " ", (body if body is not None else tree).text_content()).strip()


def index_entries(docs: Path) -> list[dict]:
    """Identifier entries (every link whose anchor is a qualified name) and concept entries
    (a top-level entry's own words, linked to ``index-N`` anchors; sub-entries such as
    "arithmetic" under "operator" mean nothing alone)."""
    import lxml.html

    tree = lxml.html.fromstring((docs / "genindex-all.html").read_bytes())
    found: dict[tuple[str, str], set[str]] = {}
    for a in tree.xpath('//table[contains(@class, "genindextable")]//a[@href]'):
        m = _LINK.fullmatch(a.get("href"))
        if m is None:
            continue
        page, anchor = m.groups()
        if _QUALIFIED.fullmatch(anchor):
            found.setdefault((anchor, "identifier"), set()).add(page)
            continue
        top = a.getparent().tag == "li" and a.getparent().getparent().getparent().tag == "td"
        words = re.sub(r"\s+", " ", a.text_content()).strip()
        if top and anchor.startswith("index-") and re.search(r"[A-Za-z]{3}", words) \
                and not re.search(r"[()_]", words):
            found.setdefault((words, "concept"), set()).add(page)
    return [{"text": t, "kind": k, "pages": sorted(p)} for (t, k), p in found.items()]


def build(docs: Path, out: Path, *, identifiers: int, concepts: int) -> dict:
    library = docs / "library"
    pages = sorted(p.name for p in library.glob("*.html"))
    entries = [e for e in index_entries(docs) if all(p in pages for p in e["pages"])]
    chosen = []
    for kind, n in (("identifier", identifiers), ("concept", concepts)):
        of_kind = sorted((e for e in entries if e["kind"] == kind), key=lambda e: stable_hash(e["text"]))
        chosen += of_kind[:n]
    texts = {name: _plain(library / name) for name in pages}
    absent = truly_absent(ABSENT, texts)
    rows = []
    for name in pages:
        html = (library / name).read_text(encoding="utf-8")
        m = re.search(r"<title>(.*?)</title>", html, re.DOTALL)
        rows.append((name, (m.group(1) if m else name).strip(), texts[name], html))
    return write_set(out, rows, chosen, absent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=Path, default=DOCS)
    ap.add_argument("--identifiers", type=int, default=IDENTIFIERS)
    ap.add_argument("--concepts", type=int, default=CONCEPTS)
    args = ap.parse_args()
    if not (args.docs / "genindex-all.html").exists():
        sys.exit(f"no Python documentation at {args.docs} (Debian: apt-get install python3.11-doc)")
    print(json.dumps(build(args.docs, args.out, identifiers=args.identifiers, concepts=args.concepts)))


if __name__ == "__main__":
    main()
