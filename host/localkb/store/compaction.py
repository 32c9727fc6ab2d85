"""Vector compaction beside the writes: one background thread per knowledge base (the host).

A write that leaves compaction due (``KnowledgeBase.write``) calls ``request``; the thread
runs ``KnowledgeBase.compact`` (built outside the store lock, swapped under it) and, if more
writes asked meanwhile, runs it again. Never two at once for one knowledge base (the
compaction's own file lock also keeps other processes out); a failure is logged, never
raised into the writer or the host's loop.
"""

from __future__ import annotations

import logging
import threading

from localkb.errors import LocalKBError

log = logging.getLogger("localkb.compaction")


class BackgroundCompaction:
    """Runs the compaction a write left due, on a thread of its own per knowledge base."""

    def __init__(self, store) -> None:
        self.store = store
        self._mutex = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._again: set[str] = set()

    def request(self, kb_id: str) -> None:
        """Start the knowledge base's compaction thread, or ask the running one to go again."""
        with self._mutex:
            running = self._threads.get(kb_id)
            if running is not None and running.is_alive():
                self._again.add(kb_id)
                return
            thread = threading.Thread(target=self.run, args=(kb_id,), daemon=True,
                                      name=f"localkb-compact-{kb_id[:8]}")
            self._threads[kb_id] = thread
            thread.start()

    def running(self) -> bool:
        with self._mutex:
            return any(t.is_alive() for t in self._threads.values())

    def run(self, kb_id: str) -> None:
        """Compact now, in this thread (and again while writes ask meanwhile)."""
        while True:
            try:
                result = self.store.open_kb(kb_id).compact()
                log.info("compaction of %s: %s in %.2f s", kb_id, result["state"], result.get("seconds", 0))
            except LocalKBError as err:
                log.warning("compaction of %s failed: %s", kb_id, err)
                try:
                    self.store.log_error("compaction", err.code, str(err), kb_id=kb_id)
                except Exception:
                    log.exception("could not log the compaction error")
            except Exception:
                log.exception("compaction of %s failed", kb_id)
            with self._mutex:
                if kb_id not in self._again:
                    self._threads.pop(kb_id, None)
                    return
                self._again.discard(kb_id)
