"""Where a fleet's journal lives, and under which leadership it is written.

The embedded default is a local file: one controller, no epoch. With a replicated store
(etcd, :mod:`rolloutcore.control`) the controller first wins leadership, which gives it an
epoch; every append is refused once a newer epoch leads, and the fleet fences every
engine with its epoch before it acts (spec: :mod:`rolloutcore.spec.failover`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rolloutcore.journal import Journal


class JournalStore(Protocol):
    @property
    def epoch(self) -> int | None:
        """The leadership's epoch while this controller leads (None: no store)."""
        ...

    @property
    def controller(self) -> str:
        """Who this controller is (journalled with a takeover)."""
        ...

    def describe(self) -> str: ...

    def holds(self) -> bool:
        """Whether this controller still leads, by its own clock (no store: always)."""
        ...

    def has_records(self) -> bool: ...

    def replay_path(self) -> AbstractContextManager[Path]:
        """A local file holding the journal as it is now (to replay)."""
        ...

    def open(self, *, fsync: bool, clock: Callable[[], float], spec_name: str) -> Journal: ...


@dataclass
class FileJournalStore:
    path: Path
    epoch: int | None = None
    controller: str = "local"

    def describe(self) -> str:
        return str(self.path)

    def holds(self) -> bool:
        return True

    def has_records(self) -> bool:
        return self.path.exists() and self.path.stat().st_size > 0

    @contextmanager
    def replay_path(self) -> Iterator[Path]:
        yield self.path

    def open(self, *, fsync: bool, clock: Callable[[], float], spec_name: str) -> Journal:
        return Journal(self.path, fsync=fsync, clock=clock, spec_name=spec_name)


class EtcdJournalStore:
    """The fleet journal on etcd, written under ``leadership`` (already won)."""

    def __init__(self, store: Any, leadership: Any, controller: str) -> None:
        self.store = store
        self.leadership = leadership
        self.controller = controller

    @property
    def epoch(self) -> int | None:
        return int(self.leadership.epoch)

    def describe(self) -> str:
        return f"{self.store.describe()} (epoch {self.epoch})"

    def holds(self) -> bool:
        return bool(self.leadership.holds())

    def has_records(self) -> bool:
        from rolloutcore.control import iter_journal_lines

        return next(iter(iter_journal_lines(self.store)), None) is not None

    @contextmanager
    def replay_path(self) -> Iterator[Path]:
        from rolloutcore.control import open_journal_source

        with open_journal_source(self.store) as path:
            yield Path(path)

    def open(self, *, fsync: bool, clock: Callable[[], float], spec_name: str) -> Journal:
        from rolloutcore.control import EtcdJournal

        del fsync  # etcd's own durability (a quorum's fsync) stands in for it
        return EtcdJournal(self.store, self.leadership, spec_name=spec_name, clock=clock)


def as_store(journal: str | Path | JournalStore) -> JournalStore:
    if isinstance(journal, str | Path):
        return FileJournalStore(Path(journal))
    return journal


__all__ = ["EtcdJournalStore", "FileJournalStore", "JournalStore", "as_store"]
