"""The one error tree of LocalKB.

Every error the core raises is a ``LocalKBError`` with a stable, machine-readable
``code``; the CLI turns it into an exit code and the host into an error reply.
Third-party errors (onnxruntime, usearch, Whoosh, sqlite, httpx) are mapped at
the boundary with ``raise X(...) from err``.

    LocalKBError                    code
    ├── InvalidInput                invalid_input
    │   ├── InvalidArchive          invalid_archive
    │   ├── InvalidDocument         invalid_document
    │   │   ├── EmptyDocument       invalid_document (a file of it is skipped as empty)
    │   │   └── UnsafeDocument      unsafe_document
    │   ├── SourceTooLarge          source_too_large
    │   ├── ProtocolError           protocol_error
    │   └── TooLarge                too_large
    ├── Unauthorized                unauthorized
    ├── Forbidden                   forbidden
    │   ├── HostNotAllowed          host_not_allowed
    │   └── OriginNotAllowed        origin_not_allowed
    ├── NotFound                    not_found
    │   ├── KnowledgeBaseNotFound   kb_not_found
    │   ├── SourceNotFound          source_not_found
    │   └── PageNotHeld             page_not_held
    ├── Conflict                    conflict
    │   └── AmbiguousReference      ambiguous
    ├── EmbeddingUnavailable        embedding_unavailable
    ├── ModelMismatch               model_mismatch
    ├── IndexUnavailable            index_unavailable
    ├── StoreError                  store_error
    ├── NothingWritten              nothing_written
    ├── FetchFailed                 fetch_failed
    ├── LLMUnavailable              llm_unavailable
    ├── TeamUnavailable             team_unavailable
    │   ├── TeamBusy                team_busy
    │   └── SchemaTooNew            schema_too_new
    ├── PrivacyBlocked              privacy_blocked
    ├── DecryptionFailed            decryption_failed
    │   └── PassphraseRequired      passphrase_required
    ├── LimitExceeded               limit_exceeded
    │   └── HostBusy                host_busy
    └── Cancelled                   cancelled
"""

from __future__ import annotations


class LocalKBError(Exception):
    """Base of every error LocalKB raises on purpose."""

    code = "localkb_error"

    def __init__(self, message: str, *, detail: dict | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or {}

    def to_dict(self) -> dict:
        out = {"code": self.code, "message": self.message}
        if self.detail:
            out["detail"] = self.detail
        return out


class InvalidInput(LocalKBError):
    """The caller sent something malformed (a field of the wrong type, a bad name)."""

    code = "invalid_input"


class InvalidArchive(InvalidInput):
    """An .awkb file failed validation; nothing was written."""

    code = "invalid_archive"


class InvalidDocument(InvalidInput):
    """A document could not be read (a broken PDF, undecodable bytes, no text)."""

    code = "invalid_document"


class EmptyDocument(InvalidDocument):
    """A document with no text at all (blank, or only white space): a file of it is skipped as
    ``empty``, as a 0-byte one is; handed over by a caller, it stays ``invalid_document``."""


class UnsafeDocument(InvalidDocument):
    """A document built to exhaust the reader: a zip bomb, XML entities, too many parts."""

    code = "unsafe_document"


class SourceTooLarge(InvalidInput):
    """A source is over the per-source size cap (``--max-size`` / ``max_source_bytes`` lifts it)."""

    code = "source_too_large"


class ProtocolError(InvalidInput):
    """A native-messaging frame or request could not be understood."""

    code = "protocol_error"


class TooLarge(InvalidInput):
    """A request, field or upload is over its size cap; nothing was read past the cap."""

    code = "too_large"


class Unauthorized(LocalKBError):
    """No token, a wrong one, or a revoked one: the team server does not know who is asking."""

    code = "unauthorized"


class Forbidden(LocalKBError):
    """The team server knows who is asking, and their roles do not allow this."""

    code = "forbidden"


class HostNotAllowed(Forbidden):
    """The request's Host header names a server other than this one (DNS rebinding): HTTP 421."""

    code = "host_not_allowed"


class OriginNotAllowed(Forbidden):
    """A request that changes something came from a page on another site."""

    code = "origin_not_allowed"


class NotFound(LocalKBError):
    code = "not_found"


class KnowledgeBaseNotFound(NotFound):
    code = "kb_not_found"


class SourceNotFound(NotFound):
    code = "source_not_found"


class PageNotHeld(NotFound):
    """A page id the host holds no page for (let go to make room, or the host restarted)."""

    code = "page_not_held"


class Conflict(LocalKBError):
    """The request clashes with what is stored (a name already taken)."""

    code = "conflict"


class AmbiguousReference(Conflict):
    """A name given to pick one thing (a source by title or file name) matches several."""

    code = "ambiguous"


class EmbeddingUnavailable(LocalKBError):
    """The embedder could not produce valid vectors; nothing partial is returned."""

    code = "embedding_unavailable"


class ModelMismatch(LocalKBError):
    """Vectors or an index belong to a different model than the knowledge base."""

    code = "model_mismatch"


class IndexUnavailable(LocalKBError):
    """A derived index could not be opened or repaired."""

    code = "index_unavailable"


class StoreError(LocalKBError):
    """The catalogue could not be read or written."""

    code = "store_error"


class NothingWritten(LocalKBError):
    """A write stored no passage at all; the reason is in the message."""

    code = "nothing_written"


class FetchFailed(LocalKBError):
    """A URL could not be fetched (network, status, size or content type)."""

    code = "fetch_failed"


class LLMUnavailable(LocalKBError):
    """A model endpoint could not be reached or failed mid-answer."""

    code = "llm_unavailable"


class TeamUnavailable(LocalKBError):
    """A team server, or the PostgreSQL behind it, could not be reached or failed."""

    code = "team_unavailable"


class TeamBusy(TeamUnavailable):
    """Every pooled database connection stayed in use past the wait bound: try again shortly."""

    code = "team_busy"


class SchemaTooNew(TeamUnavailable):
    """The team database was migrated by a newer release than this one: refused, never downgraded."""

    code = "schema_too_new"


class PrivacyBlocked(LocalKBError):
    """Strict privacy: a device-only knowledge base would have reached a cloud model."""

    code = "privacy_blocked"


class DecryptionFailed(LocalKBError):
    """Wrong passphrase or a tampered encrypted file."""

    code = "decryption_failed"


class PassphraseRequired(DecryptionFailed):
    """An encrypted file arrived without a passphrase; nothing was read or written."""

    code = "passphrase_required"


class LimitExceeded(LocalKBError):
    """A request would pass a stated limit (upload disk use, values in one message); ``detail``
    names the limit and its figure. Nothing was done."""

    code = "limit_exceeded"


class HostBusy(LimitExceeded):
    """The host already holds as much work as it takes at once (queued requests, open uploads);
    retry when some of it is done."""

    code = "host_busy"


class Cancelled(LocalKBError):
    """The operation was cancelled; the store is as it was before it started."""

    code = "cancelled"


class RateLimited(LocalKBError):
    """A daily cap of the team server was reached; ``detail`` says which, and when it resets."""

    code = "rate_limited"


class GuardrailBlocked(LocalKBError):
    """The team server's input or output checks refused a chat turn; ``detail.rule`` says which."""

    code = "guardrail_blocked"
