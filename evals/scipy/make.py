"""Build a BEIR-layout eval set from SciPy's reference (Sphinx + numpydoc), judged by its own index.

    python evals/scipy/make.py OUT [--docs DIR] [--pages N] [--identifiers N] [--concepts N]

The pages are SciPy 1.10's API reference and tutorial (``reference/``, redirect stubs
left out) as a user would save them, a fixed sample of ``--pages`` by a hash of their
paths. Relevance comes from the docs (``evals/numpydoc.py``), never from LocalKB:

- ``identifier``: every name the general index (``genindex.html``) links into the
  reference, fully qualified as its anchor spells it (``scipy.linalg.solve_banded``),
  relevant: the pages its anchors point into;
- ``concept``: the one-line summaries of the module pages' autosummary tables ("Solve
  the equation a x = b for x, assuming a is banded matrix."), relevant: the page the row
  links to;
- ``absent``: later SciPy releases' names, other libraries' and typos of real names,
  checked against every page of the corpus and dropped, loudly, if found.

The docs are Debian's ``python-scipy-doc`` (``/usr/share/doc/python-scipy-doc/html``),
under SciPy's BSD-3-Clause licence.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import numpydoc
from beirset import cli

DOCS = Path("/usr/share/doc/python-scipy-doc/html")
PAGES = 300
IDENTIFIERS = 300
CONCEPTS = 150

#: Names not in SciPy 1.10's reference, with where they come from.
ABSENT = {
    "scipy.stats.false_discovery_control": "SciPy 1.11",
    "scipy.stats.chatterjeexi": "SciPy 1.15",
    "scipy.integrate.cumulative_simpson": "SciPy 1.12",
    "scipy.linalg.cossin_decompose": "invented on scipy.linalg.cossin",
    "scipy.interpolate.FloaterHormannInterpolator": "SciPy 1.12",
    "scipy.optimize.elementwise": "SciPy 1.15",
    "scipy.stats.DunnettResult": "SciPy 1.11",
    "scipy.special.softplus": "SciPy 1.15",
    "scipy.sparse.linalg.funm_multiply_krylov": "SciPy 1.15",
    "scipy.differentiate.derivative": "SciPy 1.15",
    "torch.nn.Module": "PyTorch",
    "sklearn.cluster.KMeans": "scikit-learn",
    "pandas.DataFrame.merge": "pandas",
    "statsmodels.api.OLS": "statsmodels",
    "sympy.integrate": "SymPy",
    "scipy.linalg.solve_bandd": "typo of scipy.linalg.solve_banded",
    "scipy.optimize.minimise_scalar": "typo of scipy.optimize.minimize_scalar",
    "scipy.stats.ttest_indd": "typo of scipy.stats.ttest_ind",
    "scipy.signal.butterr": "typo of scipy.signal.butter",
    "scipy.interpolate.CubicSplin": "typo of scipy.interpolate.CubicSpline",
    "scipy.fft.rfftfreqq": "typo of scipy.fft.rfftfreq",
    "scipy.sparse.csr_matrx": "typo of scipy.sparse.csr_matrix",
    "scipy.integrate.solve_ivpp": "typo of scipy.integrate.solve_ivp",
    "scipy.spatial.KDtre": "typo of scipy.spatial.KDTree",
}


def build(docs: Path, out: Path, *, pages: int | None, identifiers: int, concepts: int) -> dict:
    return numpydoc.build(docs, out, folders=("reference",), prefix="reference/", absent=ABSENT,
                          pages=pages, identifiers=identifiers, concepts=concepts)


if __name__ == "__main__":
    cli(__doc__, build, DOCS, "genindex.html", "python-scipy-doc", pages=PAGES,
        identifiers=IDENTIFIERS, concepts=CONCEPTS)
