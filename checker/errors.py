"""The two ways a check can end without VERIFIED.

`Rejected` means the input was well formed but an obligation failed (exit 1).
`BadInput` means the input could not be read as a certificate or model at all (exit 2).
"""


class Rejected(Exception):
    """An obligation of the certificate does not hold (or cannot be confirmed)."""

    def __init__(self, obligation: str, detail: str):
        super().__init__(f"{obligation}: {detail}")
        self.obligation = obligation
        self.detail = detail


class BadInput(Exception):
    """The certificate or model file is unusable: unreadable, malformed or out of limits."""
