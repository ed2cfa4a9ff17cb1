"""New sessions under way, per tenant, in the order they came: a burst of creates is admitted
against the tenant's limit one by one, not all at once.

A create is counted among the tenant's sessions only once the host has made it, and making
one takes a kernel (up to seconds in a burst): counted by what exists alone, every create of a
burst arriving together would see the tenant under its limit, and all would be made.
"""

from __future__ import annotations

from collections import defaultdict


class Ticket:
    """One create under way: how many of its tenant's came before it and are still under way."""

    def __init__(self, line: list[Ticket]) -> None:
        self._line = line
        line.append(self)

    def ahead(self) -> int:
        return self._line.index(self)

    def done(self) -> None:
        """The create is made (now counted by its host) or failed."""
        self._line.remove(self)


class Admissions:
    """The creates under way of each tenant (on this gateway)."""

    def __init__(self) -> None:
        self._lines: defaultdict[str, list[Ticket]] = defaultdict(list)

    def enter(self, tenant: str) -> Ticket:
        return Ticket(self._lines[tenant])
