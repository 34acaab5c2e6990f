"""The journal's errors: one type per cause, each saying what to do."""

from __future__ import annotations


class JournalError(Exception):
    pass


class JournalClosed(JournalError):
    def __init__(self) -> None:
        super().__init__("the journal is closed; open it again before writing")


class JournalUnavailable(JournalError):
    """A write failed: nothing in the batch is persisted. Protocol reason `journal unavailable`."""

    reason = "journal unavailable"

    def __init__(self, cause: BaseException):
        super().__init__(
            f"journal write failed ({cause}); nothing in this batch was persisted. "
            "Free disk space or fix the journal device: the journal probes it every second and "
            "resumes by itself; resend what was not acknowledged"
        )
        self.cause = cause


class ProbeIntervalError(JournalError, ValueError):
    """TICKERTAPE_JOURNAL_PROBE_INTERVAL (journal/writer.py) is not a usable number of seconds."""

    def __init__(self, raw: str):
        super().__init__(
            f"TICKERTAPE_JOURNAL_PROBE_INTERVAL={raw!r} is not a number of seconds more than 0 and "
            "at most 60: give one (e.g. 0.1), or unset it for the default of 1 second"
        )


class JournalLocked(JournalError):
    """Another process has the journal directory open (the lock is exclusive)."""

    def __init__(self, directory: str, holder: str):
        super().__init__(
            f"journal {directory} is locked by process {holder} (a server, or `tickertape "
            "archive|compact` applying a change): one process at a time owns a journal. Stop "
            "that process, or give this one its own <JournalDirectory>"
        )
        self.directory = directory
        self.holder = holder


class CorruptSegment(JournalError):
    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(
            f"journal segment {path} is damaged at offset {offset}: {reason}. Move the file "
            "aside (and the segments after it) to start without it, or restore it from the archive"
        )
        self.path = path
        self.offset = offset
        self.reason = reason
