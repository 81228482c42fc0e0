"""The controller's control store: etcd for its journal and its leadership, so that a
standby controller can take over a fleet without a split brain.

* :mod:`~rolloutcore.control.etcd`: store URLs and :class:`EtcdStore`, bounded calls to
  an etcd cluster through its HTTP gateway;
* :mod:`~rolloutcore.control.leadership`: :class:`Leadership` (campaign, lease kept
  alive, epochs from the leader key's revision) and :func:`current_leader`;
* :mod:`~rolloutcore.control.journal`: :class:`EtcdJournal`, the file journal's chain
  with every append guarded by the writer's epoch, and its export to a file.
"""

from rolloutcore.control.etcd import (
    DEFAULT_PREFIX,
    KV,
    EtcdStore,
    StoreAmbiguous,
    StoreError,
    StoreRejected,
    StoreUnavailable,
    StoreUrl,
    StoreUrlError,
    is_store_url,
    parse_store_url,
)
from rolloutcore.control.journal import (
    Deposed,
    EtcdJournal,
    export_journal,
    iter_journal_lines,
    journal_key,
    open_journal_source,
    verify_store_chain,
)
from rolloutcore.control.leadership import (
    CampaignTimeout,
    LeaderInfo,
    Leadership,
    current_leader,
)

__all__ = [
    "DEFAULT_PREFIX", "KV", "CampaignTimeout", "Deposed", "EtcdJournal", "EtcdStore",
    "LeaderInfo", "Leadership", "StoreAmbiguous", "StoreError", "StoreRejected",
    "StoreUnavailable", "StoreUrl", "StoreUrlError", "current_leader", "export_journal",
    "is_store_url", "iter_journal_lines", "journal_key", "open_journal_source",
    "parse_store_url", "verify_store_chain",
]
