"""Build a BEIR-layout eval set from pandas' docs (Sphinx + numpydoc), judged by their own index.

    python evals/pandas/make.py OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]

The pages are pandas 1.5's API reference, user guide and getting-started pages
(``reference/``, ``user_guide/``, ``getting_started/``; redirect stubs left out) as a
user would save them, a fixed sample of ``--pages`` by a hash of their paths. Relevance
comes from the docs (``evals/numpydoc.py``), never from LocalKB:

- ``identifier``: every name the general index (``genindex.html``) links into the API
  reference, fully qualified as its anchor spells it (``pandas.DataFrame.merge``),
  relevant: the pages its anchors point into;
- ``concept``: the one-line summaries of the reference's autosummary tables ("Merge
  DataFrame or named Series objects with a database-style join."), relevant: the page
  the row links to;
- ``absent``: later pandas releases' names, other libraries' and typos of real names,
  checked against every page of the corpus and dropped, loudly, if found.

The docs are Debian's ``python-pandas-doc`` (``/usr/share/doc/python-pandas-doc/html``),
under pandas' BSD-3-Clause licence.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import numpydoc
from beirset import cli

DOCS = Path("/usr/share/doc/python-pandas-doc/html")
PAGES = 300
IDENTIFIERS = 300
CONCEPTS = 150

#: Names not in pandas 1.5's docs, with where they come from.
ABSENT = {
    "pandas.DataFrame.map": "pandas 2.1",
    "pandas.Series.case_when": "pandas 2.2",
    "pandas.ArrowDtype": "pandas 2.0 (top-level)",
    "pandas.api.interchange.from_dataframe_strict": "invented on pandas.api.interchange",
    "pandas.DataFrame.to_orc_strict": "invented on DataFrame.to_orc",
    "pandas.Series.struct": "pandas 2.2 accessor",
    "pandas.Series.list": "pandas 2.2 accessor",
    "pandas.DataFrame.from_arrow": "never in pandas",
    "polars.DataFrame.group_by": "Polars",
    "numpy.einsum": "NumPy",
    "dask.dataframe.read_parquet": "Dask",
    "pyspark.sql.DataFrame.withColumn": "PySpark",
    "sklearn.model_selection.train_test_split": "scikit-learn",
    "pandas.DataFrame.mergee": "typo of pandas.DataFrame.merge",
    "pandas.read_cvs": "typo of pandas.read_csv",
    "pandas.DataFrame.groupbby": "typo of pandas.DataFrame.groupby",
    "pandas.Series.value_count": "typo of pandas.Series.value_counts",
    "pandas.DataFrame.drop_duplicate": "typo of pandas.DataFrame.drop_duplicates",
    "pandas.to_datetme": "typo of pandas.to_datetime",
    "pandas.DataFrame.pivot_tabel": "typo of pandas.DataFrame.pivot_table",
    "pandas.DataFrame.fillnaa": "typo of pandas.DataFrame.fillna",
    "pandas.Series.str.contans": "typo of pandas.Series.str.contains",
    "pandas.DataFrame.iterrow": "typo of pandas.DataFrame.iterrows",
}


def build(docs: Path, out: Path, *, pages: int | None, identifiers: int, concepts: int) -> dict:
    return numpydoc.build(docs, out, folders=("reference", "user_guide", "getting_started"),
                          prefix="reference/", absent=ABSENT, pages=pages, identifiers=identifiers,
                          concepts=concepts)


if __name__ == "__main__":
    cli(__doc__, build, DOCS, "genindex.html", "python-pandas-doc", pages=PAGES,
        identifiers=IDENTIFIERS, concepts=CONCEPTS)
