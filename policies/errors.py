"""Errors raised by policies and by request-metadata validation."""


class InvalidRequestMetadata(ValueError):
    """A request carries scheduling metadata the policies cannot accept.

    The message is written for the API client: servers return it verbatim
    with HTTP 400.
    """
