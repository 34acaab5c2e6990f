"""Problems found in a configuration file, and the one error that carries them all.

A `Problem` names where (element path, line) and what is wrong, with what to do about it. The
loader collects every problem in a file before it raises one `ConfigError` (CONVENTIONS habit 7):
the loader raises, only `main` exits.

    str(ConfigError) ==
        "tt.xml:12: /TickertapeConfig/SOW/Queue[2]/LeasePeriod: invalid interval 'soon'; ...\n"
        "tt.xml:30: /TickertapeConfig/Transports/Transport[2]/InetAddr: port 9007 is ..."

`line` is 1-based; 0 means "the file as a whole" (for example a file that cannot be read), and
such a problem prints without a line. `path` is an XPath-like element path; sibling elements of the
same name are numbered from 1 (`Queue[2]`) only when there is more than one of them.
"""

from __future__ import annotations

import msgspec

__all__ = ["ConfigError", "Problem"]


class Problem(msgspec.Struct, frozen=True):
    """One thing wrong with a configuration, where it is, and what to do about it."""

    path: str
    line: int
    message: str

    def format(self, source: str) -> str:
        """`source:line: path: message`, leaving out the parts that are unknown."""
        where = source
        if self.line > 0:
            where = f"{where}:{self.line}"
        if self.path:
            where = f"{where}: {self.path}"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """A configuration cannot be used. `problems` lists everything found, in file order."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return "\n".join(p.format(self.source) for p in self.problems)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, list[Problem]]]:
        # keep pickling (multiprocessing, pytest-xdist) working
        return (type(self), (self.source, self.problems))
