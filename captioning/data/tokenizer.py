"""Caption tokenization that reproduces the COCO caption toolkit without Java.

pycocoevalcap tokenizes every caption with the Stanford PTBTokenizer (CoreNLP 3.4.1 jar,
``-preserveLines -lowerCase``) and then drops the punctuation tokens
``'' ' `` ` -LRB- -RRB- -LCB- -RCB- . ? ! , : - -- ... ;``.  :func:`tokenize` is an
in-process re-implementation of that pipeline for ordinary captions, written from the
tokenizer's observed behaviour:

- words split on whitespace and on punctuation, lower-cased;
- clitics split off: ``it's -> it 's``, ``don't -> do n't``, ``can't -> ca n't``,
  ``cannot -> can not``, ``gonna -> gon na``, ``'tis -> 't is``;
- hyphenated words (``ice-cream``), numbers (``3.5``, ``1,000``, ``10:30``, ``1/2``),
  acronyms (``u.s.``) and known abbreviations (``st.``, ``dr.``, ``etc.``) stay whole;
  any other word loses its final period (``bat. -> bat``);
- brackets become ``-lrb-``/``-rrb-``/``-lsb-``/... and, lower-cased, survive the toolkit's
  (upper-case) punctuation filter, exactly as with the real jar;
- runs such as ``?!`` or ``!!`` stay single tokens (and are therefore kept, as by the toolkit).

Exotic inputs (URLs, e-mail addresses, emoticons, SGML, stray apostrophes inside words) are
handled approximately.  One toolkit artefact cannot be reproduced per caption: the jar sees all
captions of a batch as one stream, so an initial at the end of a caption (``vitamin A.``) may
lose its period depending on the *next* caption; here it always keeps it.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["PUNCTUATION", "tokenize", "tokenize_ptb"]

#: Tokens that pycocoevalcap removes after PTB tokenization (the list is case sensitive).
PUNCTUATION = frozenset(
    ["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
     ".", "?", "!", ",", ":", "-", "--", "...", ";"]
)

# Abbreviations that keep their period (observed on the CoreNLP 3.4.1 tokenizer).
_ABBREV_ANY_CASE = frozenset(
    """adj adm adv al ala apr ariz assn assoc asst atty attys aug ave bancorp bhd bldg blvd brig
    bros calif capt cf cmdr co col colo comdr conn corp cos cpl ct dak dec dept det dr drs ens
    esq est etc ext feb fla fri ft ga gen gov govs hon inc ind insp intl jan jr jul jun kan kans
    ky lieut lt ltd maj mar md messrs mich minn mlle mme mo mon mont mr mrs ms msgr mt natl neb
    nev nov oct okla penn pfc ph plc pres prof profs pvt rd rep reps rev rt sen sens sep sept seq
    sfc sgt spc sq sr st ste supt supts sys tel tenn thu thurs tue tues univ va vs vt wed wis wisc
    wyo""".split()
)
# ... only when capitalised (``Mass.`` but not ``mass.``)
_ABBREV_CAPITALISED = frozenset("ark del ill la mass miss ore pa tex wash".split())
# ... in any case except all upper case
_ABBREV_NOT_UPPER = frozenset(["pte", "pty"])
# ... only before a number (``No. 5``, ``Fig. 3``)
_ABBREV_BEFORE_NUMBER = frozenset("art ca fig figs no nos op pp".split())

# Whole words split into two tokens.
_SPLIT_WORDS = {
    "cannot": ("can", "not"),
    "gonna": ("gon", "na"),
    "gotta": ("got", "ta"),
    "wanna": ("wan", "na"),
    "lemme": ("lem", "me"),
    "gimme": ("gim", "me"),
    "y'all": ("y'", "all"),
}
# Words with an inner apostrophe that stay whole.
_APOS_KEEP = frozenset(["ma'am", "ne'er", "e'er", "o'er", "li'l"])
# Words that keep a leading apostrophe (``'em``, ``'s``; also ``'90s``); ``'tis``/``'twas`` split.
_APOS_WORDS = frozenset(["em", "cause", "til", "n", "s", "re", "ll", "d", "ve", "m"])

_CHAR_MAP = {
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2018": "`", "\u2019": "'", "\u201a": "'", "\u2032": "'",
    "\u2013": "--", "\u2014": "--", "\u2015": "--",
    "\u2026": "...",
    "\u00a3": "#", "\u20ac": "$", "\u00a5": "$",
}
_AMP_RE = re.compile(r"&amp;", re.IGNORECASE)
_CHAR_RE = re.compile("|".join(map(re.escape, _CHAR_MAP)))

_A = r"[^\W_]"  # a letter or digit (any script)
_LEXER = re.compile(
    rf"""
    (?P<space>\s+)
  | (?P<url>(?:https?|ftp)://\S+|www\.\S+)
  | (?P<email>[\w.+-]+@[\w-]+(?:\.[\w-]+)+)
  | (?P<tag></?[A-Za-z][A-Za-z0-9]*>)
  | (?P<emoticon>[:;]-?[()DPp](?!\w))
  | (?P<ellipsis>\.{{3,}})
  | (?P<dashes>-{{2,}})
  | (?P<social>[#@][A-Za-z]\w*)
  | (?P<apos>'(?:{_A}+))
  | (?P<signed>[-+]\d+(?:[.,:/]\d+)*|\.\d+)
  | (?P<word>{_A}+(?:(?:[-./]|(?<=[A-Z])&(?=[A-Z])|(?<=[^\W\d_])['!?](?=[^\W\d_])|(?<=\d)[,:](?=\d)){_A}+)*)
  | (?P<bang>[?!]+)
  | (?P<quote>``|''|")
  | (?P<other>.)
    """,
    re.VERBOSE,
)
_BRACKETS = {"(": "-lrb-", ")": "-rrb-", "[": "-lsb-", "]": "-rsb-", "{": "-lcb-", "}": "-rcb-"}
_CLITIC = re.compile(r"(?i)^(.+?)('s|'re|'ll|'d|'ve|'m)$")
_NT = re.compile(r"(?i)^(.*[a-z])(n't)$")
_ACRONYM = re.compile(r"^(?:[A-Za-z]\.)*[A-Za-z]$")
_NUMBER_WITH_SEP = re.compile(r"^(\d+(?:[.,:/]\d+)+)([A-Za-z]\w*)$")


def _keeps_period(word: str, rest: str) -> bool:
    """Whether ``word`` followed by '.' is one token (abbreviation or acronym)."""
    if _ACRONYM.match(word):  # initials and acronyms: "a.", "u.s."
        return True
    low = word.lower()
    if low in _ABBREV_ANY_CASE:
        return True
    if low in _ABBREV_CAPITALISED:
        return word[0].isupper()
    if low in _ABBREV_NOT_UPPER:
        return not word.isupper()
    if low in _ABBREV_BEFORE_NUMBER:
        nxt = rest.lstrip()
        return bool(nxt) and nxt[0].isdigit()
    return False


def _split_apostrophes(word: str) -> list[str]:
    """Split a word at inner apostrophes the way the PTB lexer does (``ab'cd -> ab ` cd``)."""
    if "'" not in word or word.lower() in _APOS_KEEP:
        return [word]
    head, _, rest = word.partition("'")
    if len(head) == 1 and (head in "dlno" or (head.isupper() and head not in "IY")):
        return [head + "'" + _split_apostrophes(rest)[0], *_split_apostrophes(rest)[1:]]
    if head in ("j", "y", "Y"):
        return [head + "'", *_split_apostrophes(rest)]
    if rest.lower() == "n":
        return [head, "'n"]
    return [head, "`", *_split_apostrophes(rest)]


def _split_word(word: str) -> list[str]:
    """Split clitics and fused words off one lexer word."""
    low = word.lower()
    if low in _SPLIT_WORDS:
        return list(_SPLIT_WORDS[low])
    i = low.find("'n'")
    if i > 0 and i + 3 < len(low):
        return [*_split_word(word[:i]), "'n'", *_split_word(word[i + 3 :])]
    m = _NUMBER_WITH_SEP.match(word)
    if m:
        return [m.group(1), m.group(2)]
    tail: list[str] = []
    while True:
        m = _CLITIC.match(word)
        if m and not m.group(1).endswith("'"):
            word, clitic = m.group(1), m.group(2)
            tail.insert(0, clitic)
            continue
        m = _NT.match(word)
        if m:
            word = m.group(1)
            tail.insert(0, m.group(2))
            continue
        break
    return [*_split_apostrophes(word), *tail] if word else tail


def tokenize_ptb(text: str) -> list[str]:
    """PTB-style tokens of ``text`` (lower-cased), before punctuation removal."""
    text = unicodedata.normalize("NFC", text)
    text = _CHAR_RE.sub(lambda m: _CHAR_MAP[m.group(0)], text)
    text = _AMP_RE.sub("&", text).replace("\u200b", " ")
    out: list[str] = []
    pos, n = 0, len(text)
    while pos < n:
        m = _LEXER.match(text, pos)
        assert m is not None  # the lexer's last alternative matches any character
        kind, tok = m.lastgroup, m.group(0)
        pos = m.end()
        if kind == "space":
            continue
        if kind == "word":
            if pos < n and text[pos] == ".":
                after = text[pos + 1 : pos + 2]
                if (after and after in ",;:") or _keeps_period(tok, text[pos + 1 :]):
                    tok += "."
                    pos += 1
            out.extend(_split_word(tok))
        elif kind == "apos":
            body = tok[1:].lower()
            if body in ("tis", "twas"):
                out.extend(["'t", tok[2:]])
            elif body in _APOS_WORDS or re.fullmatch(r"\d\d(?:s)?", body):
                out.append(tok)
            else:
                out.append("`")
                pos -= len(tok) - 1  # re-lex the word after the opening quote
        elif kind == "emoticon":
            out.append(tok[:-1] + "-" + _BRACKETS[tok[-1]][1:] if tok[-1] in "()" else tok)
        elif kind == "ellipsis":
            out.append("...")
        elif kind == "dashes":
            out.append("--")
        elif kind == "quote":
            out.append("''")
        elif kind == "other":
            out.append(_BRACKETS.get(tok, tok))
        else:
            out.append(tok)
    return [t.lower() for t in out]


def tokenize(text: str) -> list[str]:
    """Lower-cased tokens of ``text`` as pycocoevalcap's PTBTokenizer + punctuation removal gives.

    ``tokenize("A man's bat.") == ["a", "man", "'s", "bat"]``.  Needs no data files.
    """
    return [t for t in tokenize_ptb(text) if t not in PUNCTUATION]
