"""The order probe (ARO's VG-Relation, here the order the data encodes): two sides swapped.

On the synthetic data the order is the annotated one: objects are listed left to right
(``shapes``), events in time order (``moving_shapes``).  Two entities swap their whole phrases
in the reference ("a red circle appears and then a blue square appears" -> "a blue square
appears and then a red circle appears"; "a red circle to the left of a blue square" -> "a blue
square to the left of a red circle"): every word and every colour-shape pair stays, only the
order changes, so a model that knows what is there but not where or when cannot tell them
apart.  One question per pair of entities and reference (2-way, chance 1/2).  Free-form
captions: ``rules.relation_swaps`` (the two sides of a relation).
"""

from __future__ import annotations

from itertools import combinations

from captioning.evaluation.probes import ProbeItem, Question, locate, register_probe
from captioning.evaluation.probes.rules import relation_swaps, swap_spans


@register_probe("order")
def order(item: ProbeItem) -> list[Question]:
    """Per reference, one question per pair of entities it names (once each)."""
    questions = []
    if not item.entities:
        for ref in item.references:
            questions += [Question(ref, (p,), "relation swap (rules)") for p in relation_swaps(ref)]
        return questions
    ents = item.entities
    for ref in item.references:
        for i, j in combinations(range(len(ents)), 2):
            a, b = locate(ref, ents[i]["words"]), locate(ref, ents[j]["words"])
            if a is None or b is None or a == b:
                continue
            first, second = sorted((a, b))
            if first[1] > second[0]:
                continue  # overlapping phrases: not two sides
            questions.append(Question(ref, (swap_spans(ref, first, second),), f"swap {i}-{j}"))
    return questions
