"""The journal's errors: one type per cause, each saying what to do."""

from __future__ import annotations


class JournalError(Exception):
    pass


class JournalClosed(JournalError):
    def __init__(self):
        super().__init__("the journal is closed; open it again before writing")


class JournalUnavailable(JournalError):
    """A write failed: nothing in the batch is persisted. Protocol reason `journal unavailable`."""

    reason = "journal unavailable"

    def __init__(self, cause: BaseException):
        super().__init__(
            f"journal write failed ({cause}); nothing in this batch was persisted. "
            "Free disk space or fix the journal device; the server retries on the next publish"
        )
        self.cause = cause


class JournalLocked(JournalError):
    """Another process holds the journal in a way that excludes this open (see Journal(exclusive=))."""

    def __init__(self, directory: str, exclusive: bool):
        what = ("a server (or another tool) has this journal open; let it apply the change, or stop it first"
                if exclusive else "`tickertape archive|compact` is applying a change to it; wait for it to finish")
        super().__init__(f"journal {directory} is locked: {what}")
        self.directory = directory


class CorruptSegment(JournalError):
    def __init__(self, path: str, offset: int, reason: str):
        super().__init__(
            f"journal segment {path} is damaged at offset {offset}: {reason}. Move the file "
            "aside (and the segments after it) to start without it, or restore it from the archive"
        )
        self.path = path
        self.offset = offset
        self.reason = reason
