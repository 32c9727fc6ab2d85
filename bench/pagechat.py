"""Chat with an open 300-page PDF against the same PDF saved: time to the first answer.

    python bench/pagechat.py [--pages 300] [--rounds 2] [--questions 6]

The PDF is real text the code was not tuned on: one SciFact abstract per page (generated
text when the data set is absent, printed as such), built with fpdf2. Each round, in a fresh
data directory, with the embedding model already loaded (neither side pays for loading it):

- saved: ``add_capture`` of the whole PDF into a new knowledge base (the save, timed), then
  the first question over it through ``run_turn`` (a new ``Library``: the knowledge base's
  indexes are opened by that question, as after a restart);
- open page: ``PageShelf.open`` (timed: what "Chat with this page" waits for, the first part
  embedded), then at once the same question through ``run_turn`` over ``WithPages`` while the
  rest of the page is still being embedded in the background.

The questions are the titles of the abstracts on pages 1..``--questions`` (what the reader
sees first), each asked once of each side, interleaved with the order swapped each time; the
open page is asked while the rest of it is still being embedded (the host pauses that work
during a turn: ``OpenPage.in_use``). Both answers are extractive (no model), so the figures
are retrieval and the wait for the embedding model. Printed per round: the wait before each
can be asked at all (save vs open), the first question's time, the median question, and how
often the first citation is the page the question came from; then the median over all
questions per side and their ratio (the page's target: at most 1.5x). Nothing here passes or
fails on time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import SCIFACT, add_record_flag, recorded, scifact_docs


def build_pdf(path: Path, docs: list[dict]) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("helvetica", size=10)
    for doc in docs:
        pdf.add_page()
        text = f"{doc['title']}\n\n{doc['text']}"
        pdf.multi_cell(0, 5, text.encode("latin-1", "replace").decode("latin-1"))
    pdf.output(str(path))
    return path


def one_round(pdf: bytes, questions: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="localkb-bench-pagechat-") as tmp:
        os.environ["LOCALKB_HOME"] = tmp
        from localkb.answer.chat import ChatOptions, run_turn
        from localkb.config import Settings
        from localkb.ingest.pipeline import add_capture
        from localkb.store.kb import Store
        from localkb.store.pagekb import PageShelf, WithPages
        from localkb.team.attached import Library

        store = Store(Settings.from_env())
        out: dict = {"saved_q": [], "page_q": [], "saved_cites": [], "page_cites": []}
        try:
            store.models.get(store.models.spec(store.settings.default_model).id).embed(["warm up"])
            kb = store.create_kb("Saved", privacy="device")
            t0 = time.perf_counter()
            add_capture(store.open_kb(kb.id), url="http://127.0.0.1:9/book.pdf", title="Book", pdf=pdf,
                        captured_by="api")
            out["save_s"] = time.perf_counter() - t0
            saved_view = Library(store)  # opened afresh: its indexes load on the first question
            shelf = PageShelf()
            t0 = time.perf_counter()
            page = shelf.open(store, url="http://127.0.0.1:9/book-open.pdf", title="Book", pdf=pdf)
            out["open_s"] = time.perf_counter() - t0
            out["searchable"] = page.status()["line"]
            page_view = WithPages(Library(store), shelf)
            opts = ChatOptions(kind="bench")

            def ask_saved(q: str) -> None:
                t0 = time.perf_counter()
                res = run_turn(saved_view, [kb.id], q, options=opts)
                out["saved_q"].append(time.perf_counter() - t0)
                out["saved_cites"].append(res.citations[0]["page"] if res.citations else None)

            def ask_page(q: str) -> None:
                t0 = time.perf_counter()
                with page.in_use():  # as the host's chat handler does
                    res = run_turn(page_view, [page.id], q, options=opts)
                out["page_q"].append(time.perf_counter() - t0)
                out["page_cites"].append(res.citations[0]["page"] if res.citations else None)

            # Interleaved, the order swapped each question: neither side always goes first.
            for n, q in enumerate(questions):
                for ask in ((ask_page, ask_saved) if n % 2 == 0 else (ask_saved, ask_page)):
                    ask(q)
            out["searched"] = page.status()["line"]
            page.stop.set()
            page.done.wait()
        finally:
            store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--pages", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--questions", type=int, default=6, help="asked of pages 1..N, each once per side")
    add_record_flag(ap)
    args = ap.parse_args()
    with recorded(args.record):
        run(args)


def run(args: argparse.Namespace) -> None:
    docs = scifact_docs(args.pages)
    real = (SCIFACT / "corpus.jsonl").exists()
    with tempfile.TemporaryDirectory() as tmp:
        pdf = build_pdf(Path(tmp) / "book.pdf", docs).read_bytes()
    questions = [d["title"] for d in docs[: args.questions]]
    print(f"{args.pages}-page PDF ({len(pdf) / 1e6:.1f} MB) of "
          f"{'SciFact abstracts' if real else 'GENERATED text (SciFact not found)'}; "
          f"questions: the titles of pages 1-{args.questions}, extractive answers")
    saved, paged, rows = [], [], []
    for n in range(1, args.rounds + 1):
        r = one_round(pdf, questions)
        rows.append(r)
        saved += r["saved_q"]
        paged += r["page_q"]
        hit_s = sum(c == i + 1 for i, c in enumerate(r["saved_cites"]))
        hit_p = sum(c == i + 1 for i, c in enumerate(r["page_cites"]))
        print(f"round {n}: before the first question: save {r['save_s']:.1f} s, open {r['open_s']:.1f} s "
              f"({r['searchable']}); first question saved {r['saved_q'][0] * 1000:.0f} ms, "
              f"open page {r['page_q'][0] * 1000:.0f} ms; median question saved "
              f"{statistics.median(r['saved_q']) * 1000:.0f} ms, open page "
              f"{statistics.median(r['page_q']) * 1000:.0f} ms; first citation on the asked page: "
              f"saved {hit_s}/{len(questions)}, open page {hit_p}/{len(questions)}; "
              f"after: {r['searched']}")
    ms, mp = statistics.median(saved), statistics.median(paged)
    first_saved = statistics.median(r["save_s"] + r["saved_q"][0] for r in rows)
    first_page = statistics.median(r["open_s"] + r["page_q"][0] for r in rows)
    print(f"median over {len(saved)} questions per side: saved {ms * 1000:.0f} ms, open page "
          f"{mp * 1000:.0f} ms, ratio {mp / ms:.2f} (target <= 1.5); time to the first answer: "
          f"saved {first_saved:.1f} s (save, then ask), open page {first_page:.1f} s")


if __name__ == "__main__":
    main()
