"""The fleet file (TOML): the engines a fleet governs, its quorum, journal and watchdog."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from rolloutcore.errors import BadInput
from rolloutcore.inputs import unreadable
from rolloutcore.spec.fleet import update_policy_error

TRANSFERS = ("reload", "gloo", "nccl")


class FleetFileError(BadInput, ValueError):
    """A fleet file that is not what the fleet reads (where and why)."""


@dataclass(frozen=True)
class EngineConfig:
    name: str
    url: str
    model: str = "tiny"
    token: str | None = None
    transfer: str = "reload"
    #: The engine is hosted in this named Ray actor (``rolloutcore fleet launch --ray``):
    #: its lifecycle goes through the actor's handle, its rollouts to ``url``.
    ray: str | None = None


@dataclass(frozen=True)
class RayConfig:
    """``[ray]``: the Ray cluster that hosts the engines named with ``ray``."""

    address: str  # host:port of the cluster's GCS
    namespace: str = "rolloutcore"


@dataclass(frozen=True)
class ControlConfig:
    """``[control]``: the replicated store that holds the fleet's journal and leadership
    (controller failover); without it the journal is a local file and one controller
    runs."""

    store: str  # etcd://host:port[,host:port...][/prefix]
    lease_s: float = 5.0  # the leader key's lease: a dead leader is replaced after it
    id: str | None = None  # this controller's name in the leader key (default host:pid)


@dataclass(frozen=True)
class AdapterConfig:
    """``[adapter]``: the policy is a LoRA adapter served on fixed base weights."""

    name: str  # the adapter's name on every engine (requests name it as their model)
    base: Path  # the base checkpoint the engines serve (its identity joins every adapter's)


@dataclass(frozen=True)
class FleetConfig:
    engines: tuple[EngineConfig, ...]
    min_serving: int
    journal: Path | None = None
    watchdog_s: float | None = None  # None: not given (``serve`` has a default)
    max_live: int = 1  # K: generations served at once (>= 2: updates roll)
    min_admitting: int = 0  # C: members serving throughout a rolling update
    control: ControlConfig | None = None  # None: a local journal file, one controller
    adapter: AdapterConfig | None = None  # None: updates change the base weights
    ray: RayConfig | None = None  # None: no engine is hosted in Ray
    staged: bool = False  # updates stage while serving, the closed window only installs
    peer_sources: bool = False  # staged bytes travel once: members stage from a peer

    @property
    def served_model(self) -> str | None:
        """The model name requests must name (None: the engines disagree)."""
        if self.adapter is not None:
            return self.adapter.name
        models = {e.model for e in self.engines}
        return models.pop() if len(models) == 1 else None


def load_fleet_file(path: str | Path) -> FleetConfig:
    """Read and check a fleet file::

        [fleet]
        min_serving = 2          # optional, default: every engine
        journal = "fleet.jsonl"  # optional, relative to the file
        watchdog_s = 10          # optional: audit every serving engine this often
        max_live = 2             # optional, default 1: >= 2 makes updates roll in waves
        min_admitting = 2        # optional, default 0: members serving throughout a roll
        staged = true            # optional, default false: stage while serving, then install
        peer_sources = true      # optional (staged): the trainer's bytes go to one member,
                                 # the others stage from it

        [[engine]]
        name = "a"
        url = "http://127.0.0.1:8001"
        model = "tiny"           # optional
        token = "..."            # optional (sent as a bearer token)
        transfer = "reload"      # optional: reload | gloo | nccl

        [control]                # optional: journal and leadership on etcd (failover)
        store = "etcd://127.0.0.1:2379"   # several endpoints: etcd://h1:p1,h2:p2[/prefix]
        lease_s = 5              # optional: a dead leader is replaced after about this
        id = "controller-a"      # optional: this controller's name (default host:pid)

        [ray]                    # engines hosted in Ray actors (rolloutcore fleet launch
        address = "127.0.0.1:6379"   # --ray writes it): the cluster, and per engine
        namespace = "rolloutcore"    # ray = "<actor name>" beside its url

        [adapter]                # optional: the policy is a LoRA adapter (engines started
        name = "pol"             # with --enable-lora); its name on every engine
        base = "models/v1"       # the base checkpoint the engines serve (relative to the file)
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise FleetFileError(unreadable(p, err)) from None
    except tomllib.TOMLDecodeError as err:
        raise FleetFileError(f"{p}: not TOML: {err}") from None
    unknown = set(data) - {"fleet", "engine", "control", "adapter", "ray"}
    if unknown:
        raise FleetFileError(f"{p}: unknown table(s) {sorted(unknown)}")
    raw = data.get("engine")
    if not isinstance(raw, list) or not raw:
        raise FleetFileError(f"{p}: no [[engine]] entries")
    engines: list[EngineConfig] = []
    for n, e in enumerate(raw, 1):
        where = f"{p}: engine {n}"
        if not isinstance(e, dict):
            raise FleetFileError(f"{where}: not a table")
        extra = set(e) - {"name", "url", "model", "token", "transfer", "ray"}
        if extra:
            raise FleetFileError(f"{where}: unknown key(s) {sorted(extra)}")
        for key in ("name", "url"):
            if not isinstance(e.get(key), str) or not e[key]:
                raise FleetFileError(f"{where}: {key} must be a non-empty string")
        for key in ("model", "token", "transfer", "ray"):
            if key in e and not isinstance(e[key], str):
                raise FleetFileError(f"{where}: {key} must be a string")
        transfer = e.get("transfer", "reload")
        if transfer not in TRANSFERS:
            raise FleetFileError(f"{where}: transfer must be one of {', '.join(TRANSFERS)}")
        if "ray" in e and (not e["ray"] or transfer != "reload"):
            raise FleetFileError(f"{where}: ray names the engine's actor (non-empty), and a "
                                 "Ray-hosted engine updates by reload")
        engines.append(EngineConfig(e["name"], e["url"], e.get("model", "tiny"),
                                    e.get("token"), transfer, e.get("ray")))
    names = [e.name for e in engines]
    if len(set(names)) != len(names):
        raise FleetFileError(f"{p}: engine names must be distinct: {names}")
    fleet = data.get("fleet", {})
    keys = {"min_serving", "journal", "watchdog_s", "max_live", "min_admitting", "staged",
            "peer_sources"}
    if not isinstance(fleet, dict) or set(fleet) - keys:
        raise FleetFileError(f"{p}: [fleet] takes {', '.join(sorted(keys))} only")
    k = fleet.get("min_serving", len(engines))
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(engines):
        raise FleetFileError(f"{p}: min_serving must be an integer in 1..{len(engines)}")
    journal = fleet.get("journal")
    if journal is not None and not isinstance(journal, str):
        raise FleetFileError(f"{p}: journal must be a path string")
    watchdog = fleet.get("watchdog_s")
    if watchdog is not None and (isinstance(watchdog, bool) or not isinstance(
            watchdog, int | float) or not 0 < watchdog < float("inf")):
        raise FleetFileError(f"{p}: watchdog_s must be a positive number of seconds")
    rolling = [fleet.get("max_live", 1), fleet.get("min_admitting", 0)]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in rolling):
        raise FleetFileError(f"{p}: max_live and min_admitting must be integers")
    bad = update_policy_error(rolling[0], rolling[1], len(engines))
    if bad:
        raise FleetFileError(f"{p}: {bad}")
    staged, peers = fleet.get("staged", False), fleet.get("peer_sources", False)
    if not isinstance(staged, bool) or not isinstance(peers, bool):
        raise FleetFileError(f"{p}: staged and peer_sources must be true or false")
    if peers and not staged:
        raise FleetFileError(f"{p}: peer_sources serve staged bytes: it needs staged = true")
    control = _control(p, data.get("control"))
    if control is not None and journal is not None:
        raise FleetFileError(f"{p}: [fleet] journal and [control] store both name where the "
                             "journal lives: give one")
    adapter = _adapter(p, data.get("adapter"))
    if adapter is not None and any(e.transfer != "reload" for e in engines):
        raise FleetFileError(f"{p}: [adapter]: adapters are loaded by the engines "
                             "(transfer = \"reload\"), not sent by a weight transfer")
    ray = _ray(p, data.get("ray"))
    hosted = [e.name for e in engines if e.ray is not None]
    if hosted and ray is None:
        raise FleetFileError(f"{p}: engine(s) {hosted} name a Ray actor but there is no [ray] "
                             "table (the cluster's address)")
    if hosted and adapter is not None:
        raise FleetFileError(f"{p}: [adapter]: LoRA adapters are updated over HTTP; a "
                             "Ray-hosted engine updates its base weights")
    if peers and (hosted or adapter is not None):
        raise FleetFileError(f"{p}: peer_sources: engines reached over HTTP serve peers; "
                             "not Ray-hosted engines, nor LoRA adapter updates")
    return FleetConfig(tuple(engines), k, (p.parent / journal) if journal else None,
                       None if watchdog is None else float(watchdog), max_live=rolling[0],
                       min_admitting=rolling[1], control=control, adapter=adapter, ray=ray,
                       staged=staged, peer_sources=peers)


def _ray(p: Path, raw: object) -> RayConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or "address" not in raw or set(raw) - {"address",
                                                                        "namespace"}:
        raise FleetFileError(f"{p}: [ray] takes address (required) and namespace")
    address, namespace = raw["address"], raw.get("namespace", "rolloutcore")
    host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FleetFileError(f"{p}: [ray] address must be host:port, not {address!r:.60}")
    if not isinstance(namespace, str) or not namespace:
        raise FleetFileError(f"{p}: [ray] namespace must be a non-empty string")
    return RayConfig(address, namespace)


def _adapter(p: Path, raw: object) -> AdapterConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"name", "base"}:
        raise FleetFileError(f"{p}: [adapter] takes name and base, both required")
    name, base = raw["name"], raw["base"]
    if not isinstance(name, str) or not name or not isinstance(base, str) or not base:
        raise FleetFileError(f"{p}: [adapter] name and base must be non-empty strings")
    return AdapterConfig(name, p.parent / base)


def _control(p: Path, raw: object) -> ControlConfig | None:
    if raw is None:
        return None
    keys = {"store", "lease_s", "id"}
    if not isinstance(raw, dict) or set(raw) - keys:
        raise FleetFileError(f"{p}: [control] takes {', '.join(sorted(keys))} only")
    store = raw.get("store")
    if not isinstance(store, str) or not store.startswith("etcd://"):
        raise FleetFileError(f"{p}: [control] store must be an etcd:// URL, not {store!r:.60}")
    from rolloutcore.control import StoreUrlError, parse_store_url

    try:
        parse_store_url(store)
    except StoreUrlError as e:
        raise FleetFileError(f"{p}: [control] store: {e}") from None
    lease = raw.get("lease_s", 5.0)
    if isinstance(lease, bool) or not isinstance(lease, int | float) or not 1 <= lease <= 600:
        raise FleetFileError(f"{p}: [control] lease_s must be a number of seconds in 1..600")
    ident = raw.get("id")
    if ident is not None and (not isinstance(ident, str) or not ident.strip()):
        raise FleetFileError(f"{p}: [control] id must be a non-empty string")
    return ControlConfig(store, float(lease), ident)


__all__ = ["TRANSFERS", "ControlConfig", "EngineConfig", "FleetConfig", "FleetFileError",
           "load_fleet_file"]
