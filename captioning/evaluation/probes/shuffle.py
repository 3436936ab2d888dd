"""The shuffle probe (ARO's COCO-/Flickr30k-Order): the reference against four word shuffles.

ARO's four perturbations, with content words in place of its tagged nouns and adjectives:
content words shuffled among themselves, the other words shuffled, trigrams shuffled, words
shuffled within each trigram.  Content words: on the synthetic data the annotated word classes
(colours, shapes, verbs); on free-form captions every word that is not a function word
(``rules.content_words``).  One 5-way question per reference (chance 1/5; fewer candidates
when a shuffle cannot change the caption, e.g. a single content word).  Each shuffle is drawn
from a generator seeded by the item, the reference and the perturbation, so it is the same on
every run and for every model.  A caption passes this probe by sounding like a caption: it tests
the language model more than the image, and serves as the probes' sanity check.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from captioning.evaluation.probes import ProbeItem, Question, Tokens, register_probe
from captioning.evaluation.probes.rules import content_words

KINDS = ("shuffle content words", "shuffle other words", "shuffle trigrams", "shuffle within trigrams")
DRAWS = 10  # a shuffle that returns the reference is drawn again, up to this many times


def _permute(tokens: Sequence[str], positions: list[int], rng: np.random.Generator) -> Tokens:
    t = list(tokens)
    for dst, src in zip(positions, rng.permutation(positions).tolist(), strict=True):
        t[dst] = tokens[src]
    return tuple(t)


def shuffled(tokens: Sequence[str], kind: str, content: list[int], rng: np.random.Generator) -> Tokens:
    """One draw of perturbation ``kind`` of ``tokens`` (``content``: the content words' positions)."""
    n = len(tokens)
    if kind == KINDS[0]:
        return _permute(tokens, content, rng)
    if kind == KINDS[1]:
        return _permute(tokens, [k for k in range(n) if k not in set(content)], rng)
    grams = [list(tokens[k: k + 3]) for k in range(0, n, 3)]
    if kind == KINDS[2]:
        return tuple(w for g in rng.permutation(len(grams)).tolist() for w in grams[g])
    return tuple(w for g in grams for w in rng.permutation(g).tolist())


def perturbations(item: ProbeItem, r: int) -> tuple[Tokens, ...]:
    """Reference ``r``'s distinct shuffles, one per kind that can change it."""
    ref = item.references[r]
    classes = {w for words in item.word_classes.values() for w in words}
    content = [k for k, w in enumerate(ref) if w in classes] if classes else content_words(ref)
    out: list[Tokens] = []
    for p, kind in enumerate(KINDS):
        rng = np.random.default_rng([zlib.crc32(item.key.encode()), r, p])
        for _ in range(DRAWS):
            t = shuffled(ref, kind, content, rng)
            if t != ref and t not in out:
                out.append(t)
                break
    return tuple(out)


@register_probe("shuffle")
def shuffle(item: ProbeItem) -> list[Question]:
    """One question per reference that at least one shuffle changes."""
    questions = []
    for r, ref in enumerate(item.references):
        p = perturbations(item, r)
        if p:
            questions.append(Question(ref, p, "ARO order shuffles"))
    return questions
