"""The reproduction as data: the catalogue (stores, variants, claims) and a protocol.

``conf/reproduce/catalogue.yaml`` lists the FeatureStores, the variants trained on them and the
claims tested on them; ``conf/reproduce/<protocol>.yaml`` fixes the data seeds, the budget, the
decoding, the checkpoint selection and the verdict rule, and may state its own claims (which
then replace the catalogue's) and the probes its test evaluations run.  Both are plain YAML read into the
dataclasses below and checked (an unknown store, variant or rule is one line naming it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from captioning.config import CONF_DIR
from captioning.errors import ConfigError

REPRODUCE_CONF = Path(CONF_DIR) / "reproduce"
RULES = ("beats", "at_least", "above_chance", "times_chance", "at_chance", "lead_grows")
DATASETS = {"shapes": "image", "moving_shapes": "video"}
METHODS = ("t_interval", "random_effects")  # the verdict's interval (captioning_reproduce.report)


@dataclass(frozen=True)
class Store:
    name: str
    data: str  # shapes | moving_shapes
    extract: tuple[str, ...]  # captioning-extract overrides


@dataclass(frozen=True)
class Variant:
    name: str
    store: Store
    epochs: int
    overrides: tuple[str, ...]  # captioning-train overrides (LSTM sizes from the protocol's budget)

    @property
    def data(self) -> str:
        return self.store.data


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    rule: str
    a: str
    metric: str
    b: str | None = None
    threshold: float | None = None
    margin: float | None = None
    factor: float | None = None
    metric_low: str | None = None
    headline: bool = False
    confidence: float | None = None  # this claim's interval (e.g. 0.90: a TOST at 5% per side); None: the protocol's

    @property
    def variants(self) -> tuple[str, ...]:
        return (self.a,) if self.b is None else (self.a, self.b)


@dataclass(frozen=True)
class Catalogue:
    stores: dict[str, Store]
    variants: dict[str, Variant]
    claims: list[Claim]


@dataclass(frozen=True)
class Protocol:
    """What a reproduction run is: which data seeds (headline claims / the rest), the budget, the
    decoding per dataset, whether the checkpoint is selected on val, the verdict's confidence."""

    name: str
    data_seeds: dict[str, list[int]]  # headline | other -> data seeds
    budget: dict[str, Any]  # images, videos, hidden, lr
    decode: dict[str, list[str]]  # dataset -> captioning-evaluate decode overrides
    select_on_val: bool = True
    verdict: dict[str, Any] = field(default_factory=lambda: {"confidence": 0.95})
    probes: list[str] = field(default_factory=list)  # captioning-evaluate probes=[...] on the test split
    claims: list[dict[str, Any]] | None = None  # the protocol's own claims (None: the catalogue's)

    def seeds_for(self, claim: Claim) -> list[int]:
        return list(self.data_seeds["headline" if claim.headline else "other"])

    def items(self, data: str) -> int:
        return int(self.budget["images" if data == "shapes" else "videos"])


def _plain(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"no reproduction config at {path}")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def load_catalogue(path: str | Path = REPRODUCE_CONF / "catalogue.yaml") -> Catalogue:
    raw = _plain(Path(path))
    stores = {n: Store(n, s["data"], tuple(s["extract"])) for n, s in raw["stores"].items()}
    for s in stores.values():
        if s.data not in DATASETS:
            raise ConfigError(f"{path}: store {s.name} reads data={s.data!r}; use one of {list(DATASETS)}")
    variants = {}
    for n, v in raw["variants"].items():
        if v["store"] not in stores:
            raise ConfigError(f"{path}: variant {n} reads store {v['store']!r}, which is not in stores")
        variants[n] = Variant(n, stores[v["store"]], int(v["epochs"]), tuple(v["overrides"]))
    return Catalogue(stores, variants, read_claims(raw["claims"], variants, path))


def read_claims(raw: list[dict[str, Any]], variants: dict[str, Variant], path: str | Path) -> list[Claim]:
    """Claims from their YAML entries, each checked (its rule known, its variants in the catalogue)."""
    claims = [Claim(**c) for c in raw]
    for c in claims:
        if c.rule not in RULES:
            raise ConfigError(f"{path}: claim {c.id} has rule {c.rule!r}; use one of {list(RULES)}")
        missing = [v for v in c.variants if v not in variants]
        if missing:
            raise ConfigError(f"{path}: claim {c.id} names variant {missing[0]!r}, which is not in variants")
    return claims


def claims_of(catalogue: Catalogue, protocol: Protocol) -> list[Claim]:
    """The claims a protocol tests: its own when it states them, else the catalogue's."""
    if protocol.claims is None:
        return catalogue.claims
    return read_claims(protocol.claims, catalogue.variants, f"conf/reproduce/{protocol.name}.yaml")


def load_protocol(name_or_path: str | Path) -> Protocol:
    """``development`` / ``confirmation`` (a file of conf/reproduce/) or a path to a protocol YAML."""
    path = Path(name_or_path)
    if path.suffix != ".yaml":
        path = REPRODUCE_CONF / f"{name_or_path}.yaml"
    raw = _plain(path)
    protocol = Protocol(**raw)
    if set(protocol.data_seeds) != {"headline", "other"}:
        raise ConfigError(f"{path}: data_seeds needs the keys headline and other")
    if protocol.verdict.get("method", "t_interval") not in METHODS:
        raise ConfigError(f"{path}: verdict.method={protocol.verdict['method']!r}; use one of {list(METHODS)}")
    return protocol
