"""Text from requests made safe for the service's log: control characters (NUL, escape
sequences, CR and LF that would forge a line) are written escaped, ``\\x00``, never raw."""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
#: a traceback keeps its own line breaks
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _escape(m: re.Match) -> str:
    # a lone surrogate too (a request's JSON may carry one): the log's encoder cannot write it
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``text`` with every control character escaped (``\\x00``, ``\\x0a``)."""
    return _CONTROL.sub(_escape, str(text))


class EscapeControl(logging.Filter):
    """Escapes control characters in a record's message and traceback, whatever its
    arguments held (a request's path, a value in an exception's message)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        escaped = printable(message)
        if escaped != message or record.args:
            record.msg, record.args = escaped, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = _CONTROL_BUT_NEWLINE.sub(_escape, record.exc_text)
        return True


#: loggers that write what requests carry
LOGGERS = ("spillway.api", "spillway.jobs", "spillway.jobdb", "uvicorn.error")


def install() -> None:
    """Put the filter on the service's loggers (once)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, EscapeControl) for f in logger.filters):
            logger.addFilter(EscapeControl())
