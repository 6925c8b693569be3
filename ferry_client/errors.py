"""Errors the client raises: the broker's own, and giving up (docs/client.md#errors)."""

from typing import Any


class FerryError(Exception):
    """The broker refused the request, with the `{"error": {...}}` body's code, message, detail.

    Branch on `code` (the table in docs/api.md), show `message` to people. `status` is the
    HTTP status, or None when the error came over the WebSocket.
    """

    def __init__(
        self,
        code: str,
        message: str,
        detail: dict[str, Any] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail = detail or {}
        self.status = status

    @classmethod
    def from_body(cls, body: Any, status: int | None = None) -> "FerryError":
        """The error in a `{"error": {"code", "message", "detail"}}` body, whatever the class."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or not isinstance(error.get("code"), str):
            return cls(f"http_{status}", f"Unexpected answer: {str(body)[:200]}", status=status)
        detail = error.get("detail")
        return cls(
            error["code"],
            str(error.get("message", "")),
            detail if isinstance(detail, dict) else {},
            status,
        )


class BrokerUnavailable(FerryError):
    """No broker URL answered in time, after every retry; the last failure is the __cause__.

    `code` is the last 5xx answer's code (e.g. broker_error), else "unavailable". Sending again
    is safe: messages keep their ids, so the broker stores each one once.
    """


class Reject(Exception):
    """Raise from a consumer handler to send the message straight to the dead-letter queue.

    Any other exception nacks it (retried after the group's backoff); the text is kept as the
    message's last error.
    """
