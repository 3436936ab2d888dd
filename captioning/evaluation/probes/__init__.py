"""Forced-choice probes of binding and order (ARO-style: Yuksekgonul et al. 2023).

A probe turns each test item's reference captions into *questions*: the reference against
minimally perturbed versions of it (attributes swapped between two objects, the two sides of an
order swapped, words shuffled).  The model scores every candidate by its length-normalised
teacher-forced log-likelihood given the image (``captioning.models.likelihood``); it answers a
question right when the reference scores highest.  Chance is exact: 1/k for k candidates (a
model that cannot tell them apart ties, and ties are split: the reference tied with m - 1 others
at the top earns 1/m, the expected credit of a random tie-break).  Every item with a perturbable
reference counts, whatever the model would have generated.

A probe is one module of this package: a function ``ProbeItem -> [Question]`` registered with
``@register_probe(name)``; ``probes=[binding,order,shuffle]`` picks them (``captioning-evaluate``,
``captioning-score``).  On the synthetic data the perturbations come from the annotations (the
grounding file knows each object's or event's words); on free-form captions from the POS-free
rule set of ``rules``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captioning.registry import Registry

Tokens = tuple[str, ...]


@dataclass(frozen=True)
class Question:
    """The reference against its perturbations; ``kind`` says what was perturbed."""

    reference: Tokens
    perturbations: tuple[Tokens, ...]
    kind: str


@dataclass(frozen=True)
class ProbeItem:
    """A test item as the probes see it: its id, tokenized references and, on the synthetic data,
    its grounding entry (``objects`` or ``events`` with their words) and the word classes."""

    key: str
    references: tuple[Tokens, ...]
    grounding: Mapping[str, Any] | None = None
    word_classes: Mapping[str, Sequence[str]] = field(default_factory=dict)

    @property
    def cluster(self) -> str:
        """The unit the item is drawn with: its time-reversal pair on ``moving_shapes`` (videos 2k
        and 2k+1 share their content), else the item itself."""
        pair = (self.grounding or {}).get("pair")
        return self.key if pair is None else f"pair{pair}"

    @property
    def entities(self) -> list[Mapping[str, Any]]:
        """The annotated objects (images) or events (videos), in rank order; [] without grounding."""
        g = self.grounding or {}
        return list(g.get("objects") or g.get("events") or [])


Probe = Callable[[ProbeItem], list[Question]]
#: name -> probe; every module of this package registers its probe on import
PROBES: Registry[Probe] = Registry("probe", config_key="probes", discover=__name__)


def register_probe(name: str, **meta: Any) -> Callable[[Probe], Probe]:
    """Function decorator: make ``probes=[<name>]`` run this probe."""
    return PROBES.register(name, **meta)


def locate(tokens: Sequence[str], words: Sequence[str]) -> tuple[int, int] | None:
    """The span of the one occurrence of ``words`` in ``tokens``; None when absent or repeated."""
    n, hits = len(words), []
    for k in range(len(tokens) - n + 1):
        if list(tokens[k: k + n]) == list(words):
            hits.append((k, k + n))
    return hits[0] if len(hits) == 1 else None
