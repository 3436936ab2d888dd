"""The binding probe (ARO's VG-Attribution): attributes swapped between two objects.

On the synthetic data an object (image) or event (video) is named by its colour and shape
("a red circle", "a red circle appears").  Two entities with different colours AND different
shapes swap colours in the reference ("a red circle, a blue square" -> "a blue circle, a red
square"): the bag of colours and the bag of shapes stay the same, only which colour goes with
which shape changes.  Only swaps whose two new pairs occur nowhere in the item (distractors
included) are asked, so a perturbed caption never names something that is there, and never
names one pair twice (which a language model could reject without looking).  One question per
eligible swap and reference (2-way, chance 1/2).  Free-form captions: ``rules.attribute_swaps``.
"""

from __future__ import annotations

from itertools import combinations

from captioning.evaluation.probes import ProbeItem, Question, locate, register_probe
from captioning.evaluation.probes.rules import attribute_swaps


def colour_swaps(item: ProbeItem) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of entities whose colours can be swapped (see the module docstring)."""
    ents = item.entities
    present = {(e["colour"], e["shape"]) for e in ents}
    present |= {(d["colour"], d["shape"]) for d in (item.grounding or {}).get("distractors") or []}
    out = []
    for i, j in combinations(range(len(ents)), 2):
        (ci, si), (cj, sj) = (ents[i]["colour"], ents[i]["shape"]), (ents[j]["colour"], ents[j]["shape"])
        if ci != cj and si != sj and (cj, si) not in present and (ci, sj) not in present:
            out.append((i, j))
    return out


@register_probe("binding")
def binding(item: ProbeItem) -> list[Question]:
    """Per reference, one question per eligible attribute swap."""
    questions = []
    if not item.entities:
        for ref in item.references:
            questions += [Question(ref, (p,), "attribute swap (rules)") for p in attribute_swaps(ref)]
        return questions
    swaps = colour_swaps(item)
    for ref in item.references:
        for i, j in swaps:
            a, b = locate(ref, item.entities[i]["words"]), locate(ref, item.entities[j]["words"])
            if a is None or b is None:
                continue  # the reference does not name both (once each)
            t = list(ref)
            t[a[0]], t[b[0]] = t[b[0]], t[a[0]]  # the colour is each entity's first word
            questions.append(Question(ref, (tuple(t),), f"colour swap {i}-{j}"))
    return questions
