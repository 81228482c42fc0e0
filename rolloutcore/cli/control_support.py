"""What the command line needs around the control store (a fleet file's ``[control]``).

* :func:`leading`: win the fleet's leadership for one command, with a bounded wait, and
  resign when the command ends (also on error);
* :func:`read_leader`, :func:`leader_json`, :func:`another_leads`: the current leader, as
  the commands show it;
* :func:`deposed_line`: the one line of a controller deposed in mid-command;
* :func:`journal_failure`: whether the etcd journal refuses every further append.

Every store call is bounded (:data:`STORE_TIMEOUT_S`): a store that is down, or has no
quorum, is said in one line (:class:`ControlExit`, exit 3) within seconds, never a hang.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rolloutcore.cli.exits import CANNOT_RUN, NEGATIVE
from rolloutcore.control.etcd import EtcdStore, StoreError
from rolloutcore.control.journal import iter_journal_lines
from rolloutcore.control.leadership import (
    CampaignTimeout,
    LeaderInfo,
    Leadership,
    current_leader,
)
from rolloutcore.errors import Deposed

if TYPE_CHECKING:
    from rolloutcore.fleet.config import ControlConfig

#: Each call to the store, every member tried, takes at most this long.
STORE_TIMEOUT_S = 3.0
#: The least a campaign is given (``--wait 0`` included): its own round trips (a lease
#: grant, a transaction) need time even when nobody else leads.
CAMPAIGN_MIN_S = 2.0


class ControlExit(Exception):
    """A command that cannot go on because of the control store: its exit code (1:
    another controller leads; 3: the store cannot be used) and one line."""

    def __init__(self, code: int, message: str, leader: LeaderInfo | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.leader = leader


def controller_id(control: ControlConfig) -> str:
    """This controller's name in the leader key: the fleet file's ``id``, else host:pid."""
    return control.id or f"{socket.gethostname()}:{os.getpid()}"


def open_store(control: ControlConfig, timeout_s: float = STORE_TIMEOUT_S) -> EtcdStore:
    """The store the fleet file names (its URL was checked when the file was loaded)."""
    return EtcdStore.from_url(control.store, timeout_s=timeout_s)


def unavailable(store: EtcdStore, err: BaseException) -> ControlExit:
    return ControlExit(CANNOT_RUN, f"control store {store.url}: unavailable: {err}")


def check_store(store: EtcdStore) -> None:
    """Raise :class:`ControlExit` (3) unless the store answers with a quorum."""
    try:
        store.check()
    except StoreError as e:
        raise unavailable(store, e) from None


def read_leader(store: EtcdStore) -> LeaderInfo | None:
    """The current leader (None: nobody); :class:`ControlExit` (3) if the store fails."""
    try:
        return current_leader(store)
    except StoreError as e:
        raise unavailable(store, e) from None


def has_journal(store: EtcdStore) -> bool:
    """Whether the store holds a journal under its prefix (read only)."""
    try:
        return next(iter(iter_journal_lines(store, page=1)), None) is not None
    except StoreError as e:
        raise unavailable(store, e) from None


def leader_json(info: LeaderInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"id": info.id, "host": info.host, "pid": info.pid, "epoch": info.epoch,
            "lease_s_left": info.ttl_s, "since": info.since}


def describe_leader(info: LeaderInfo) -> str:
    return f"{info.id} at epoch {info.epoch} (lease {info.ttl_s:g} s left)"


def another_leads(info: LeaderInfo, waited_s: float = 0.0) -> ControlExit:
    waited = f" (waited {waited_s:g} s)" if waited_s > 0 else ""
    return ControlExit(NEGATIVE, f"another controller leads: {describe_leader(info)}"
                       f"{waited}; ask it (its admin API) or --wait", info)


@contextmanager
def leading(control: ControlConfig, *, wait_s: float = 0.0) -> Iterator[Leadership]:
    """This controller as the fleet's leader for the ``with`` block, resigned afterwards
    (whatever happens in it). Another leader still there after ``wait_s`` seconds:
    :class:`ControlExit` 1 naming it; a store that cannot be used: :class:`ControlExit` 3.
    The leadership's ``store`` is the one to build the journal store on."""
    store = open_store(control)
    try:
        check_store(store)  # down or without a quorum: said at once, not after the wait
        info = read_leader(store)
        if info is not None and wait_s <= 0:  # nobody to wait for: no campaign at all
            raise another_leads(info)
        lead = Leadership(store, controller_id(control), ttl_s=control.lease_s)
        try:
            lead.campaign(timeout_s=max(wait_s, CAMPAIGN_MIN_S))
        except CampaignTimeout as e:
            info = read_leader(store)
            if info is not None:
                raise another_leads(info, wait_s) from None
            raise ControlExit(CANNOT_RUN, f"control store {store.url}: not elected: "
                              f"{e}") from None
        try:
            yield lead
        finally:
            lead.resign()  # bounded by the store's timeout; the lease expires otherwise
    finally:
        store.close()


def deposed_line(err: BaseException) -> str:
    """The line of a controller whose append was refused (:class:`~rolloutcore.control.
    Deposed`) or whose store failed in mid-command (it cannot know it still leads)."""
    text = " ".join(str(err).split())
    if isinstance(err, Deposed):
        return text if text.startswith("deposed") else f"deposed: {text}"
    return (f"deposed: the control store failed in mid-command, so this controller cannot "
            f"know it still leads; nothing more is done: {text}")


def journal_failure(journal: object) -> str | None:
    """Why the etcd journal refuses every further append (after a refused or failed
    append), or None. Read from the journal's own record of it: a gateway must stop
    leading once its journal can no longer write, even while its lease still holds."""
    failure = getattr(journal, "_failure", None)
    return None if failure is None else str(failure)


__all__ = ["CAMPAIGN_MIN_S", "STORE_TIMEOUT_S", "ControlExit", "another_leads",
           "check_store", "controller_id", "deposed_line", "describe_leader",
           "has_journal", "journal_failure", "leader_json", "leading", "open_store",
           "read_leader", "unavailable"]
