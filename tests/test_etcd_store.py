"""The control store on a real etcd: URLs, bounded calls, leadership by lease (one winner,
epochs that only grow, takeover only after the holder's belief has ended), the journal
appended only under the live leader key (a deposed leader's append refused by etcd and
writing nothing), the chain continued by the next leader, group commit (fewer
transactions than records, the file journal's bytes), and a 3-member cluster losing one
member (appends go on) and then two (an append fails in bounded time, then refuses).

etcd is required: CI installs it (Makefile), so a missing binary fails here, never skips.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import LATE_S, wait_until

from rolloutcore.conformance.fixtures.etcd_server import (
    EtcdCluster,
    EtcdError,
    EtcdServer,
    etcd_binary,
)
from rolloutcore.conformance.make_traces import FixedClock, s_update_cycle
from rolloutcore.control import (
    CampaignTimeout,
    Deposed,
    EtcdJournal,
    EtcdStore,
    Leadership,
    StoreUnavailable,
    StoreUrlError,
    current_leader,
    export_journal,
    iter_journal_lines,
    journal_key,
    open_journal_source,
    parse_store_url,
    verify_store_chain,
)
from rolloutcore.control.etcd import op_put
from rolloutcore.engine.controller import Controller, TraceRecord
from rolloutcore.journal import Journal, JournalError, read_journal, verify_chain

BOUND = 15.0  # against a broken test, never a measurement
FLEET = "RolloutCoreFleet"


@pytest.fixture
def store(etcd: EtcdServer, request: pytest.FixtureRequest) -> Iterator[EtcdStore]:
    """A store on the module's etcd under a prefix of this test's own."""
    with EtcdStore.from_url(etcd.url(f"/t/{request.node.name.replace('[', '-')[:60]}"
                                     .rstrip("]"))) as s:
        yield s


def _admit(sink: Callable[[TraceRecord], Any], name: str, detail: Any = None) -> Any:
    return sink(TraceRecord(0, "admit", name, "READY", 1, 0, "none", detail))


def _journal_keys(store: EtcdStore) -> list[str]:
    kvs, _, _ = store.range(store.key("journal") + "/", store.key("journal") + "0")
    return [kv.key for kv in kvs]


# --------------------------------------------------------------------------- URLs


def test_store_urls() -> None:
    u = parse_store_url("etcd://127.0.0.1:2379,10.0.0.2:2381,[::1]:2390", "/rolloutcore/f1")
    assert u.endpoints == ("127.0.0.1:2379", "10.0.0.2:2381", "[::1]:2390")
    assert u.prefix == "/rolloutcore/f1"  # the caller's default: no path in the URL
    assert parse_store_url("etcd://h:1/a/b/").prefix == "/a/b"  # the URL's path overrides
    assert parse_store_url("etcd://etcd.local").endpoints == ("etcd.local:2379",)
    assert parse_store_url("etcd://h:1/x").url == "etcd://h:1/x"


@pytest.mark.parametrize("url", [
    "", "  ", "127.0.0.1:2379", "http://127.0.0.1:2379", "etcd://", "etcd:///x",
    "etcd://h:0", "etcd://h:65536", "etcd://h:port", "etcd://h:1,,h:2", "etcd://h:1,h:1",
    "etcd://-h:1", "etcd://h:1/a b", "etcd://h:1/a//b", "etcd://user@h:1", "etcd://h:1?x=1",
    "etcd://h:1/ä",
])
def test_bad_store_urls(url: str) -> None:
    with pytest.raises(StoreUrlError) as e:
        parse_store_url(url)
    assert "\n" not in str(e.value) and str(e.value)


def test_unreachable_store_fails_within_its_timeout() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = closed.getsockname()[1]
    closed.close()  # nothing listens: refused at once
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)  # connects (the kernel's backlog), never answers: a hung member
    try:
        for url in (f"etcd://127.0.0.1:{dead}", f"etcd://127.0.0.1:{mute.getsockname()[1]}",
                    f"etcd://127.0.0.1:{dead},127.0.0.1:{mute.getsockname()[1]}/p"):
            store = EtcdStore.from_url(url, timeout_s=0.5)
            for call in (store.check, lambda s=store: s.get(s.key("leader")),
                         lambda s=store: s.grant(5)):
                t0 = time.monotonic()
                with pytest.raises(StoreUnavailable) as e:
                    call()
                assert time.monotonic() - t0 < 0.5 + LATE_S, url
                assert "\n" not in str(e.value) and "127.0.0.1" in str(e.value)
            store.close()
        lead = Leadership(store, "a", ttl_s=2.0)  # the last: one dead, one mute member
        t0 = time.monotonic()
        with pytest.raises(CampaignTimeout, match="not elected within") as ct:
            lead.campaign(timeout_s=0.6)
        assert time.monotonic() - t0 < 0.6 + LATE_S and "\n" not in str(ct.value)
    finally:
        mute.close()


# --------------------------------------------------------------------- leadership


def test_one_leader_and_epochs_grow(store: EtcdStore) -> None:
    """Two candidates: exactly one wins; the other wins only once the first resigns (a)
    or its lease expires (b, frozen: keep-alive stopped); every epoch is greater than the
    one before, and the frozen holder's own belief ends before its successor is elected."""
    a, b, c = (Leadership(store, n, ttl_s=1.0) for n in ("a", "b", "c"))
    assert not a.holds() and a.epoch == 0 and current_leader(store) is None
    epoch_a = a.campaign(timeout_s=5)
    assert a.holds() and epoch_a == a.epoch > 0
    with pytest.raises(CampaignTimeout, match="held by a "):
        b.campaign(timeout_s=0.3)  # a holds it: b waits, then gives up
    info = current_leader(store)
    assert info is not None and (info.id, info.epoch) == ("a", epoch_a)
    assert 0 <= info.ttl_s <= 1 and info.pid > 0

    b = Leadership(store, "b", ttl_s=1.0)
    won: dict[str, float] = {}

    def run(lead: Leadership) -> None:
        lead.campaign(timeout_s=BOUND)
        won[lead.controller_id] = time.monotonic()

    tb = threading.Thread(target=run, args=(b,))
    tb.start()
    assert "b" not in won and a.holds()
    t0 = time.monotonic()
    assert a.resign() and a.resign()  # idempotent
    assert not a.holds() and a.lost.is_set()
    tb.join(BOUND)
    assert b.holds() and b.epoch > epoch_a
    takeover_resign = won["b"] - t0

    lost_calls: list[str] = []
    b.on_lost(lambda: lost_calls.append(b.lost_reason))
    tc = threading.Thread(target=run, args=(c,))
    tc.start()
    wait_until(lambda: b.refreshes >= 1, "b refreshed its lease")
    t0 = time.monotonic()
    b.suspend_keepalive()  # b freezes: its lease is no longer refreshed
    tc.join(BOUND)
    assert c.holds() and c.epoch > b.epoch > epoch_a
    assert b.deadline < won["c"]  # b stopped believing before c was elected
    wait_until(lambda: b.lost.is_set(), "b's loss noticed")
    assert lost_calls == ["lease not refreshed for 0.8 s (deadline passed)"]
    assert not b.holds() and b.resign()  # cleans up; the key is c's now, left alone
    assert current_leader(store).id == "c"  # type: ignore[union-attr]
    print(f"\ntakeover after resign {takeover_resign * 1e3:.0f} ms; after a freeze "
          f"{(won['c'] - t0) * 1e3:.0f} ms with ttl 1 s")
    with pytest.raises(RuntimeError, match="new Leadership"):
        b.campaign(timeout_s=1)
    c.resign()
    assert current_leader(store) is None


def test_leadership_context_manager_and_cancelled_campaign(store: EtcdStore) -> None:
    with Leadership(store, "ctx", ttl_s=2.0) as lead:
        assert lead.holds() and current_leader(store).id == "ctx"  # type: ignore[union-attr]
        standby = Leadership(store, "standby", ttl_s=2.0)
        outcome: list[BaseException] = []

        def campaign() -> None:
            try:
                standby.campaign()  # forever, until cancelled
            except CampaignTimeout as e:
                outcome.append(e)

        t = threading.Thread(target=campaign)
        t.start()
        assert standby.resign()  # a standby shutting down: its campaign gives up
        t.join(BOUND)
        assert not t.is_alive() and "cancelled" in str(outcome[0])
        assert current_leader(store).id == "ctx"  # type: ignore[union-attr]
    assert not lead.holds() and current_leader(store) is None
    assert not standby.holds() and standby.epoch == 0


# ------------------------------------------------------------------------ journal


def test_deposed_leader_append_is_refused_and_next_leader_continues(store: EtcdStore,
                                                                    tmp_path: Path) -> None:
    a = Leadership(store, "a", ttl_s=5.0)
    a.campaign(timeout_s=5)
    ja = EtcdJournal(store, a, spec_name=FLEET)
    sink = ja.member("e0")
    for i in range(5):
        _admit(sink, f"r{i}")
    assert ja.last_seq == 5 and ja.txns == 6  # the header, then one per append
    before = list(iter_journal_lines(store))

    # a freezes; its lease ends on the server (revoked here, as expiry would) and b is
    # elected, while a's own clock still says it leads: a zombie.
    a.suspend_keepalive()
    store.revoke(a._lease)
    b = Leadership(store, "b", ttl_s=1.5)
    b.campaign(timeout_s=5)
    assert a.holds() and b.holds() and b.epoch > a.epoch
    with pytest.raises(Deposed, match=r"a \(epoch \d+\) was deposed; leader now b ") as e:
        _admit(sink, "zombie")
    assert "\n" not in str(e.value)
    assert list(iter_journal_lines(store)) == before  # nothing written
    txns = ja.txns
    with pytest.raises(Deposed, match="nothing more is written"):
        ja.fleet_step("publish", "READY", 1, 1)
    assert ja.txns == txns and ja.last_seq == 5  # refused here, not even sent

    jb = EtcdJournal(store, b, spec_name=FLEET)
    assert (jb.last_seq, jb.last_hash) == (ja.last_seq, ja.last_hash)  # continues the chain
    _admit(jb.member("e1"), "r-b")
    jb.fleet_step("publish", "READY", 1, 1, {"why": "b"})
    out = tmp_path / "exported.jsonl"
    assert export_journal(store, out) == 8
    report, recs = read_journal(out)
    assert report.ok and verify_chain(out).ok and verify_store_chain(store).ok
    assert [r["seq"] for r in recs] == list(range(8))
    assert [r.get("param") for r in recs[1:7]] == ["r0", "r1", "r2", "r3", "r4", "r-b"]
    assert _journal_keys(store)[-1] == journal_key(store, 7)

    # b's own clock ends its term: it refuses before asking the store.
    b.suspend_keepalive()
    wait_until(lambda: not b.holds(), "b's term over by its own clock", timeout=5)
    with pytest.raises(Deposed, match="does not hold leadership"):
        _admit(jb.member("e1"), "late")
    with pytest.raises(Deposed, match="does not hold leadership"):
        EtcdJournal(store, b, spec_name=FLEET)
    b.resign()
    a.resign()


def test_unawaited_waits_where_lines_wait_in_memory(store: EtcdStore) -> None:
    """An etcd journal's line reaches the store only with its batch: a record appended
    unawaited is still sent before the block ends (a reader sees every release)."""
    lead = Leadership(store, "u", ttl_s=5.0)
    lead.campaign(timeout_s=5)
    ej = EtcdJournal(store, lead, group_commit=True)
    assert not ej.writes_through
    txns = ej.txns
    with ej.unawaited():
        _admit(ej.member("e0"), "u1", None)
    assert ej.txns == txns + 1 and not ej._pending
    ej.close()


def test_group_commit_fewer_txns_and_the_file_journal_bytes(store: EtcdStore,
                                                            tmp_path: Path) -> None:
    lead = Leadership(store, "g", ttl_s=5.0)
    lead.campaign(timeout_s=5)
    # A controller's update cycle, then fleet records (secrets redacted, evidence), the
    # latter deferred: one batch, one transaction. The same into a file journal.
    clock_e, clock_f = FixedClock(), FixedClock()
    ej = EtcdJournal(store, lead, clock=clock_e, group_commit=True)
    fj = Journal(tmp_path / "f.jsonl", fsync=False, clock=clock_f)
    detail = {"Authorization": "Bearer abcdefghijklmnopqrstuvwxyz", "tokens": [1, 2, 3],
              "decision": {"verdict": "ok", "logprobs": [-0.5, -1.25]}}
    for j in (ej, fj):
        s_update_cycle(Controller(trace=j))
        with j.deferred():
            for i in range(20):
                _admit(j.member(f"e{i % 3}"), f"d{i}", detail)
            j.fleet_step("publish", "READY", 2, 2, {"members": ["e0", "e1"]})
    assert ej.group_commit and ej.last_seq == fj.last_seq > 40
    records = ej.last_seq  # header excluded
    assert ej.txns == ej.fsyncs + 1 < records  # the header alone, then one per batch
    out = tmp_path / "e.jsonl"
    export_journal(store, out)
    assert out.read_bytes() == fj.path.read_bytes()

    # Concurrent writers: each waits for a transaction, appends arriving meanwhile
    # share the next one.
    n_threads, per = 8, 25
    txns0 = ej.txns
    params: dict[str, tuple[str, int]] = {}

    def writer(t: int) -> None:
        sink = ej.member(f"w{t}")
        for k in range(per):
            _admit(sink, f"w{t}-{k}")

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(BOUND)
    seconds = time.perf_counter() - t0
    sent = ej.txns - txns0
    assert sent < n_threads * per, sent
    print(f"\ngroup commit: {n_threads * per} records in {sent} transactions, "
          f"{seconds / (n_threads * per) * 1e3:.2f} ms per record")
    export_journal(store, out)
    report, recs = read_journal(out)
    assert report.ok and len(recs) == ej.last_seq + 1
    for t in range(n_threads):  # each writer's records in its own order
        mine = [r["param"] for r in recs if r.get("engine") == f"w{t}"]
        assert mine == [f"w{t}-{k}" for k in range(per)]
    # The same records in the order the store has them: the file journal's bytes.
    for r in recs[fj.last_seq + 1:]:
        params[r["param"]] = (r["engine"], r["seq"])
        _admit(fj.member(r["engine"]), r["param"])
    assert out.read_bytes() == fj.path.read_bytes()
    ej.close()
    with pytest.raises(JournalError, match="closed"):
        _admit(ej.member("x"), "after-close")
    # Reopened: the chain continues where it ended.
    ej2 = EtcdJournal(store, lead, clock=FixedClock(clock_e.t))
    assert (ej2.last_seq, ej2.last_hash) == (fj.last_seq, fj.last_hash)
    lead.resign()


def test_single_append_latency(store: EtcdStore) -> None:
    lead = Leadership(store, "lat", ttl_s=5.0)
    lead.campaign(timeout_s=5)
    j = EtcdJournal(store, lead)
    sink = j.member("e0")
    n = 50
    t0 = time.perf_counter()
    for i in range(n):
        _admit(sink, f"r{i}")
    per = (time.perf_counter() - t0) / n
    assert j.txns == n + 1
    print(f"\nsingle append (one transaction each): {per * 1e3:.2f} ms")
    lead.resign()


def test_broken_chain_in_the_store_is_refused(store: EtcdStore) -> None:
    lead = Leadership(store, "x", ttl_s=5.0)
    lead.campaign(timeout_s=5)
    j = EtcdJournal(store, lead)
    for i in range(3):
        _admit(j.member("e"), f"r{i}")
    key = journal_key(store, 2)
    line = json.loads(store.get(key).value)  # type: ignore[union-attr]
    line["param"] = "forged"
    store.txn([], [op_put(key, json.dumps(line, sort_keys=True,
                                          separators=(",", ":")).encode())])
    with pytest.raises(JournalError, match="chain broken at line 3: hash does not match"):
        EtcdJournal(store, lead)
    assert not verify_store_chain(store).ok
    # A line under another seq's key is refused too, even with an intact chain.
    store.txn([], [op_put(key, b"")])
    store.txn([], [op_put(journal_key(store, 9), b"x")])
    with pytest.raises(JournalError, match="chain broken at line 3"):
        EtcdJournal(store, lead)
    lead.resign()


def test_export_pages_and_journal_source(store: EtcdStore, tmp_path: Path) -> None:
    lead = Leadership(store, "p", ttl_s=5.0)
    lead.campaign(timeout_s=5)
    j = EtcdJournal(store, lead, group_commit=True)
    with j.deferred():
        for i in range(40):
            _admit(j.member("e"), f"r{i}")
    whole = list(iter_journal_lines(store))
    assert len(whole) == 41 and list(iter_journal_lines(store, page=7)) == whole
    for source in (store.url, store):
        with open_journal_source(source) as path:
            assert path.read_bytes() == b"".join(whole) and verify_chain(path).ok
        assert not path.exists()  # the temporary export is gone
    local = tmp_path / "j.jsonl"
    with open_journal_source(local) as p:
        assert p == local
    with pytest.raises(JournalError, match="no journal under"), \
            open_journal_source(store.url + "/empty"):
        pass
    with pytest.raises(StoreUrlError):
        open_journal_source("etcd://h:x").__enter__()
    lead.resign()


# ------------------------------------------------------------------------ cluster


def test_cluster_survives_one_member_and_fails_closed_without_quorum() -> None:
    try:
        etcd_binary()
    except EtcdError as missing:
        pytest.fail(f"{missing} (the etcd tests need a real etcd; `make install` installs it)")
    with EtcdCluster(3) as cluster:
        store = EtcdStore.from_url(cluster.url("/q"), timeout_s=1.0)
        store.check()
        lead = Leadership(store, "q", ttl_s=3.0)
        lead.campaign(timeout_s=5)
        lost = threading.Event()
        lead.on_lost(lost.set)
        j = EtcdJournal(store, lead, spec_name=FLEET)
        sink = j.member("e0")
        _admit(sink, "before")

        # The member this store talks to dies: the others (a quorum) carry on; the next
        # append finds its connection refused and goes to another member.
        first = cluster.endpoints.index(store.current_endpoint)
        cluster.kill(first)
        probe = EtcdStore.from_url(cluster.url("/q"), timeout_s=1.0)

        def has_quorum() -> bool:  # (if the dead one led, the others elect a leader)
            try:
                probe.check()
            except StoreUnavailable:
                return False
            return True

        wait_until(has_quorum, "a quorum of two")
        # (The lease's keepalive may have met the dead member first and moved already.)
        for i in range(5):
            _admit(sink, f"one-down-{i}")
        assert store.current_endpoint != cluster.endpoints[first]
        assert lead.holds() and j.last_seq == 6

        # A second member dies: no quorum. The append fails within the store's timeout
        # (its outcome unknown), and every later one is refused at once.
        second = next(i for i in range(3) if i != first
                      and cluster.endpoints[i] != store.current_endpoint)
        cluster.kill(second)
        t0 = time.monotonic()
        with pytest.raises(JournalError, match="outcome unknown") as e:
            _admit(sink, "no-quorum")
        assert time.monotonic() - t0 < store.timeout_s + LATE_S
        assert "\n" not in str(e.value)
        sent: list[str] = []  # refused at once: nothing is sent to etcd
        attempt = store._attempt

        def counted(i: int, path: str, *args: Any, **kwargs: Any) -> Any:
            sent.append(path)
            return attempt(i, path, *args, **kwargs)

        store._attempt = counted  # type: ignore[method-assign]
        with pytest.raises(JournalError, match="nothing more is written"):
            _admit(sink, "after")
        assert sent == []
        del store._attempt
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match="unavailable"):
            store.check()
        assert time.monotonic() - t0 < store.timeout_s + LATE_S
        # Nor can the lease be refreshed: leadership lapses by the holder's own clock.
        assert lost.wait(lead.ttl_s + 1.0) and not lead.holds()
        assert "deadline passed" in lead.lost_reason
        store.close()
        probe.close()
