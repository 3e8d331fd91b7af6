"""The one exception type users see: a message meant to be printed on one line."""


class SpecError(ValueError):
    """Bad input or an unusable model/datastore; the message says what to change."""
