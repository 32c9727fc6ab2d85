"""Progress of one ingest job as a whole: sources done of total, passages, one rate and an ETA.

The unit of work is the model token: embedding is where the time goes, and a token
costs about the same whatever source it comes from. The rate is tokens embedded over
the job's elapsed time since the model was ready (never one batch's; a first add that builds
the model reports that as its own ``model`` stage, not as a slow rate), and the ETA divides the tokens still
to embed by it. Tokens still to embed are those chunked but not embedded yet plus an
estimate for the bytes not read yet, at the tokens-per-byte seen so far in this job;
sources found unchanged take their bytes out of the estimate. Until something has been
embedded the rate and the ETA are ``None`` ("not known yet"), never a guess.

Events follow CONTRACTS.md ("Ingest progress events"): ``stage``, ``done``, ``total``
(of the current stage) and the job-wide ``sources_done``, ``sources_total``, ``current``,
``passages``, ``unit``, ``rate``, ``eta_s``, ``elapsed_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Progress = Callable[[dict], None]

#: Events of the same stage closer together than this are dropped (a host frame each).
MIN_INTERVAL_S = 0.2
#: No rate (and no ETA) before this much time and this many tokens: the first batch
#: includes loading the model and would make both wrong by an order of magnitude.
WARMUP_S = 1.0
WARMUP_TOKENS = 2_000


class JobProgress:
    """Thread-safe counters of one job; ``emit`` sends an event through ``sink``."""

    def __init__(self, sink: Progress | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._sink = sink
        self._clock = clock
        self._lock = threading.Lock()
        self.started = clock()
        #: When the model was ready: the rate counts from here (a model build is not embedding).
        self.rate_from = self.started
        self.sources_total = 0
        self.sources_done = 0
        self.current: str | None = None
        self.passages = 0  # passages embedded (or reused from staging) so far
        self.tokens_embedded = 0
        self.tokens_chunked = 0  # tokens of passages that will need the model
        self.bytes_total = 0  # bytes of the sources that may still need work
        self.bytes_read = 0  # of those, read and chunked so far
        self.tokens_from_bytes = 0  # tokens chunked from the bytes counted in bytes_read
        self._last_emit = 0.0
        self._last_stage: str | None = None

    # -- counters (called by the pipeline's threads) -------------------------------------
    def add_sources(self, n: int, nbytes: int = 0) -> None:
        with self._lock:
            self.sources_total += n
            self.bytes_total += nbytes

    def source_done(self, *, unread_bytes: int = 0) -> None:
        """One more source finished; ``unread_bytes`` of it never needed reading (unchanged, skipped)."""
        with self._lock:
            self.sources_done += 1
            self.bytes_total = max(0, self.bytes_total - unread_bytes)

    def chunked(self, nbytes: int, tokens_to_embed: int, tokens_all: int) -> None:
        """``nbytes`` more of the input were chunked into passages of ``tokens_all`` tokens,
        ``tokens_to_embed`` of which need the model (the others keep stored vectors)."""
        with self._lock:
            self.bytes_read += nbytes
            self.tokens_from_bytes += tokens_all
            self.tokens_chunked += tokens_to_embed

    def discount(self, tokens: int) -> None:
        """Tokens counted as to-embed that will not be (a source that failed, vectors reused)."""
        with self._lock:
            self.tokens_chunked = max(self.tokens_embedded, self.tokens_chunked - tokens)

    def embedded(self, passages: int, tokens: int) -> None:
        with self._lock:
            self.passages += passages
            self.tokens_embedded += tokens

    # -- figures ---------------------------------------------------------------------
    def model_ready(self) -> None:
        """The model is built and loaded: the rate (and so the ETA) counts from now."""
        with self._lock:
            self.rate_from = self._clock()

    def elapsed(self) -> float:
        return self._clock() - self.started

    def rate(self) -> float | None:
        """Tokens per second since the model was ready, or None while it is not known."""
        elapsed = self._clock() - self.rate_from
        if elapsed < WARMUP_S or self.tokens_embedded < WARMUP_TOKENS:
            return None
        return self.tokens_embedded / elapsed

    def tokens_left(self) -> int:
        pending = max(0, self.tokens_chunked - self.tokens_embedded)
        unread = max(0, self.bytes_total - self.bytes_read)
        per_byte = self.tokens_from_bytes / self.bytes_read if self.bytes_read else 0.0
        return pending + round(unread * per_byte)

    def eta(self) -> float | None:
        rate = self.rate()
        if rate is None or (self.bytes_read == 0 and self.bytes_total):
            return None
        return self.tokens_left() / rate

    def snapshot(self) -> dict:
        with self._lock:
            rate, eta = self.rate(), self.eta()
            return {"sources_done": self.sources_done, "sources_total": self.sources_total,
                    "current": self.current, "passages": self.passages, "unit": "tokens",
                    "tokens_done": self.tokens_embedded,
                    "tokens_total": self.tokens_embedded + self.tokens_left(),
                    "rate": None if rate is None else round(rate, 1),
                    "eta_s": None if eta is None else round(eta, 1),
                    "elapsed_s": round(self.elapsed(), 2)}

    def emit(self, stage: str, done: int, total: int, *, current: str | None = None,
             force: bool = False) -> None:
        """Send one event; repeats of a stage within ``MIN_INTERVAL_S`` are dropped unless forced."""
        if current is not None:
            self.current = current
        if self._sink is None:
            return
        now = self._clock()
        with self._lock:
            if not force and stage == self._last_stage and now - self._last_emit < MIN_INTERVAL_S:
                return
            self._last_emit, self._last_stage = now, stage
        self._sink({"stage": stage, "done": done, "total": total, **self.snapshot()})
