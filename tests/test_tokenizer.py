"""The in-process PTB tokenizer against the toolkit's tokenized references and the real jar."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from captioning.data.tokenizer import PUNCTUATION, tokenize, tokenize_ptb

FAKECAP = Path(__file__).resolve().parents[1].parent / "shared/reference/coco-caption-fakecap"


def _fakecap_pairs() -> list[tuple[str, str]]:
    raw = json.loads((FAKECAP / "captions_val2014_raw_subset134.json").read_text())
    tok = json.loads((FAKECAP / "captions_val2014_fakecap_refs_tokenized.json").read_text())
    by_image: dict[int, list[str]] = defaultdict(list)
    for a in sorted(tok["annotations"], key=lambda a: a["id"]):
        by_image[a["image_id"]].append(a["caption"])
    raw_by_image: dict[int, list[str]] = defaultdict(list)
    for a in raw["annotations"]:
        raw_by_image[a["image_id"]].append(a["caption"])
    pairs = []
    for image_id, captions in raw_by_image.items():
        assert len(captions) == len(by_image[image_id]), image_id
        pairs += list(zip(captions, by_image[image_id], strict=True))
    return pairs


@pytest.mark.skipif(not FAKECAP.is_dir(), reason=f"reference data not found: {FAKECAP}")
def test_fakecap_raw_captions_tokenize_like_the_toolkit():
    pairs = _fakecap_pairs()
    assert len(pairs) == 671
    mismatches = [(raw, " ".join(tokenize(raw)), ref) for raw, ref in pairs if " ".join(tokenize(raw)) != ref]
    assert not mismatches, f"{len(mismatches)}/{len(pairs)} differ, e.g. {mismatches[:3]}"


# Expected outputs observed on the CoreNLP 3.4.1 jar + the toolkit's punctuation removal.
CASES = [
    ("A man's bat.", "a man 's bat"),
    ("It's a dog's life, isn't it?", "it 's a dog 's life is n't it"),
    ("I don't know. They can't, won't.", "i do n't know they ca n't wo n't"),
    ("We're here; they'll go, I'd say, I've seen, I'm ok", "we 're here they 'll go i 'd say i 've seen i 'm ok"),
    ("Cannot gonna wanna gotta", "can not gon na wan na got ta"),
    ("'Tis the season", "'t is the season"),
    ('He said "hello" and \'bye\' to me', "he said hello and bye to me"),
    ("A man -- with a bat ... waits", "a man with a bat waits"),
    ("3.5 inches, $5.00, 50%, 1,000 people, 10:30 am, 1/2 cup, 3-4 dogs",
     "3.5 inches $ 5.00 50 % 1,000 people 10:30 am 1/2 cup 3-4 dogs"),
    ("Mr. Smith and Dr. Jones at St. Mary's with U.S. flag", "mr. smith and dr. jones at st. mary 's with u.s. flag"),
    ("e-mail well-dressed ice-cream x-ray", "e-mail well-dressed ice-cream x-ray"),
    ("Parentheses (like this) and [brackets]", "parentheses -lrb- like this -rrb- and -lsb- brackets -rsb-"),
    ("The ball is red....", "the ball is red"),
    ("What?! Really!!", "what ?! really !!"),
    ("dogs' bowls", "dogs bowls"),
    ("A tab\tseparated  line  ", "a tab separated line"),
    ("A mirror with a clock by it..", "a mirror with a clock by it"),
    ("“Smart quotes” — it’s fine…", "smart quotes it 's fine"),
    ("O'Neil's o'clock", "o'neil 's o'clock"),
    ("the '90s and 80's", "the '90s and 80 's"),
    ("AT&T &amp; Q&A", "at&t & q&a"),
    ("a cat;a dog:a bird", "a cat a dog a bird"),
    ("the bat., then", "the bat. then"),
    ("", ""),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_tokenize_cases(text, expected):
    assert " ".join(tokenize(text)) == expected


def _jar_available() -> bool:
    if shutil.which("java") is None:
        return False
    try:
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer  # noqa: F401
    except ImportError:
        return False
    return True


VARIED = [
    "It's raining; don't go out!", "A hot-dog stand's sign reads \"3.5 dollars\".", "The cat sat on the mat...",
    "a bat.", "A man at bat. Another man.", "Two dogs' toys, one cat's bowl", "She can't, he won't, they shouldn't",
    "A 3-year-old boy (in red) holds a 1/2 eaten apple", "Temperature: 72 degrees at 10:30 a.m. today",
    "Mrs. Jones' car is parked on Main St. near 5th Ave.", "A sign says 'STOP' -- or does it?",
    "Is that a T-shirt?! Yes!!", "He said, \"I'm gonna win.\"", "An 8x10 photo of a 1,000 piece puzzle",
    "A woman with $20 and 50% off", "rock'n'roll band on stage", "A plate with fries & a burger & a drink",
    "   leading and trailing spaces   ", "UPPER CASE CAPTION WITH DON'T", "a dog -- a cat - a mouse",
    "e.g. a cat, i.e. a pet, etc.", "The U.S. flag flies at the U.N. building.", "no. 5 train at platform No. 9",
]


@pytest.mark.skipif(not _jar_available(), reason="needs Java and pycocoevalcap's PTBTokenizer jar")
def test_matches_the_real_ptb_tokenizer_jar():
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    strings = [s for s, _ in CASES if s] + VARIED
    jar = PTBTokenizer().tokenize({i: [{"caption": s}] for i, s in enumerate(strings)})
    diffs = [(s, jar[i][0], " ".join(tokenize(s))) for i, s in enumerate(strings) if jar[i][0] != " ".join(tokenize(s))]
    assert not diffs, diffs


def test_agrees_with_nltks_treebank_tokenizer_on_coco_captions():
    """NLTK's Treebank tokenizer (data-free with preserve_line=True) is an independent PTB tokenizer:
    after the toolkit's punctuation filter it splits every raw COCO caption of the fakecap subset as
    ours does.  Before the filter the two differ only where the Stanford jar does: it writes an
    opening quote as '' (NLTK ``) and splits '..' into two periods."""
    nltk_tokenize = pytest.importorskip("nltk.tokenize").word_tokenize
    raw = FAKECAP / "captions_val2014_raw_subset134.json"
    if not raw.is_file():
        pytest.skip(f"reference data not found: {raw}")
    captions = [a["caption"] for a in json.loads(raw.read_text())["annotations"]]
    assert len(captions) == 671
    theirs = [nltk_tokenize(c.lower(), preserve_line=True) for c in captions]
    assert [[t for t in x if t.upper() not in PUNCTUATION and t not in ("``", "..")] for x in theirs] == [
        tokenize(c) for c in captions]
    differ = [c for c, t in zip(captions, theirs, strict=True) if t != tokenize_ptb(c)]
    assert len(differ) == 3 and all('"' in c or ".." in c for c in differ)
