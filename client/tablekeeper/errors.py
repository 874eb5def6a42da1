"""The SDK's exceptions, and the one mapping from wire statuses to them.

Application errors come from the response body's BookKeeper status code; the server adds a
human-readable reason in the `tk-error` trailing metadata. Transport problems become
`UnavailableError` once retries (where safe) are exhausted.
"""

from __future__ import annotations


class TableKeeperError(Exception):
    """Base of every SDK error. `code` is the BookKeeper status code (0 if none)."""

    code: int = 0
    retryable: bool = False

    def __init__(self, message: str = "", *, code: int | None = None) -> None:
        super().__init__(message or type(self).__name__)
        if code is not None:
            self.code = code


class BadRequestError(TableKeeperError):
    code = 400


class IllegalOpError(TableKeeperError):
    code = 403


class InternalServerError(TableKeeperError):
    code = 500
    retryable = True


class NotImplementedOnServerError(TableKeeperError):
    code = 501


class UnexpectedError(TableKeeperError):
    """A condition retrying cannot fix; the message says which: the server could not tell whether
    a write was applied (its log failed mid-append), or the range's stored data is damaged and it
    refuses to serve it rather than serve incomplete data."""

    code = 600


class BadVersionError(TableKeeperError):
    """A compare-and-set on the key's version failed."""

    code = 900


class BadRevisionError(TableKeeperError):
    code = 901


class InvalidNamespaceNameError(TableKeeperError):
    code = 2000


class NamespaceExistsError(TableKeeperError):
    code = 2001


class NamespaceNotFoundError(TableKeeperError):
    code = 2002


class InvalidTableNameError(TableKeeperError):
    code = 2100


class TableExistsError(TableKeeperError):
    code = 2101


class TableNotFoundError(TableKeeperError):
    code = 2102


class InvalidKeyError(TableKeeperError):
    """Empty or oversized key."""

    code = 6000


class KeyExistsError(TableKeeperError):
    code = 6001


class KeyNotFoundError(TableKeeperError):
    code = 6002


class UnavailableError(TableKeeperError):
    """The service could not be reached or kept answering "not served here" until the deadline."""

    retryable = True


class UnauthenticatedError(TableKeeperError):
    """The server wants credentials this client did not send, or refused them (expired,
    tampered, signed by another key). The message says which; never retried."""


class PermissionDeniedError(TableKeeperError):
    """The caller's role lacks a permission; the message names it and the namespace."""


class ResourceLimitError(TableKeeperError):
    """The request is over one of the server's limits (ops per Batch, bytes of one response,
    ...; gRPC RESOURCE_EXHAUSTED). Nothing was applied; the message carries the server's reason,
    which names the limit and its flag. Sending the same request again cannot succeed: send
    less per request."""


_BY_CODE: dict[int, type[TableKeeperError]] = {
    cls.code: cls
    for cls in (
        BadRequestError,
        IllegalOpError,
        InternalServerError,
        NotImplementedOnServerError,
        UnexpectedError,
        BadVersionError,
        BadRevisionError,
        InvalidNamespaceNameError,
        NamespaceExistsError,
        NamespaceNotFoundError,
        InvalidTableNameError,
        TableExistsError,
        TableNotFoundError,
        InvalidKeyError,
        KeyExistsError,
        KeyNotFoundError,
    )
}


def error_for_code(code: int, message: str = "") -> TableKeeperError:
    """The exception for a non-zero BookKeeper status code."""
    cls = _BY_CODE.get(code, TableKeeperError)
    return cls(message or f"status {code}", code=code)
