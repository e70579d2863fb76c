"""Labelled bracket scores exactly as EVALB (Sekine & Collins) computes them, in Python.

Inputs are one bracketed tree per line (gold and test). With the parameters of COLLINS.prm
(:meth:`EvalbParams.collins`, the default) the numbers, the per-sentence table and the summary
equal ``evalb -p COLLINS.prm gold test``:

* a line is read the way EVALB reads it: ``(LABEL word)`` is a terminal, any other ``(LABEL``
  opens a constituent; terminals whose label is a DELETE_LABEL (TOP, -NONE-, , : `` '' .) are
  dropped before spans are computed, so punctuation never moves a span boundary;
* constituent labels are cut at the first ``-`` or ``=`` (NP-SBJ-1 -> NP); constituents whose
  span is empty after that, or whose label is a DELETE_LABEL (TOP), are not counted;
* a gold bracket matches the first unmatched test bracket with the same span and an equal label
  (EQ_LABEL ADVP PRT makes those two equal); LABELED 0 ignores labels;
* a sentence whose test tree has no words is skipped; one whose word counts or words differ
  (or that is malformed) is an error sentence; both are left out of the totals. As EVALB does,
  the run stops when more than MAX_ERROR + 1 errors have been seen (a parameter file's
  MAX_ERROR -1 stops at the first error, as EVALB; max_error None: never);
* "len<=CUTOFF_LEN" counts the gold words except those labelled -NONE- (punctuation included).

When the test tree carries ``XX`` in place of POS tags (a linearized parser's output) and it has
as many terminals as the gold tree has non-empty ones, the gold tags are put in their place first
(``retag_xx``), so that the reference's tags decide what is punctuation.

Where EVALB's C code has undefined behaviour (a ``)`` with nothing open) this counts an error
sentence; input that makes EVALB loop until it dies (text outside any bracket, a bracket with
two words) raises NmtError. EVALB's fixed buffers (5000 bytes a line, 200 words) are not imitated.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Sequence

from nmt.errors import NmtError
from nmt.io import iter_lines

log = logging.getLogger("nmt.metrics")

_WS = " \t\n\v\f\r"  # C isspace() in the "C" locale
_TERMINATORS = _WS + "()"
# A terminal as EVALB sees it: '(' label whitespace word ')', nothing bracketed in between.
_TERMINAL = re.compile(r"\(([^ \t\n\v\f\r()]*)[ \t\n\v\f\r]+([^ \t\n\v\f\r()]*)\)")

OK, ERROR, SKIP = 0, 1, 2


@dataclass
class EvalbParams:
    labeled: bool = True
    delete_labels: list[str] = field(default_factory=list)
    delete_labels_for_length: list[str] = field(default_factory=list)
    eq_labels: list[tuple[str, str]] = field(default_factory=list)
    eq_words: list[tuple[str, str]] = field(default_factory=list)
    cutoff_len: int = 40
    max_error: int | None = 10        # None: never stop (nmt-score --max-errors -1)

    @classmethod
    def collins(cls) -> "EvalbParams":
        """The parameters of EVALB's COLLINS.prm, the standard for WSJ parsing results."""
        return cls(labeled=True,
                   delete_labels=["TOP", "-NONE-", ",", ":", "``", "''", "."],
                   delete_labels_for_length=["-NONE-"],
                   eq_labels=[("ADVP", "PRT")], cutoff_len=40, max_error=10)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "EvalbParams":
        """Read an EVALB parameter file (``KEY value`` lines, ``#`` comments). A line that
        starts with a blank is no parameter to EVALB (it compares each keyword with the start
        of the line, and says "Unknown keyword"): skipped with a warning, so that the score is
        EVALB's."""
        p = cls(delete_labels=[], delete_labels_for_length=[])
        for lineno, line in enumerate(iter_lines(path), 1):
            bare = line.strip(_WS)
            if bare.startswith("#") or len(bare) < 3:
                continue
            if line[0] in _WS:
                log.warning("%s: line %d starts with a blank, so EVALB does not read it as a "
                            "parameter; skipped: %s", path, lineno, bare[:60])
                continue
            line = bare
            # KEY, then a run of whitespace, then the value (the rest of the line).
            m = re.match(r"([^ \t\n\v\f\r]+)[ \t\n\v\f\r]*(.*)", line)
            key, value = m.group(1), m.group(2)
            try:
                if key == "DEBUG":
                    continue
                elif key == "MAX_ERROR":
                    p.max_error = int(value)
                elif key == "CUTOFF_LEN":
                    p.cutoff_len = int(value)
                elif key == "LABELED":
                    p.labeled = int(value) != 0
                elif key == "DELETE_LABEL":
                    p.delete_labels.append(value)
                elif key == "DELETE_LABEL_FOR_LENGTH":
                    p.delete_labels_for_length.append(value)
                elif key in ("EQ_LABEL", "EQ_WORD"):
                    pair = value.split()
                    if len(pair) != 2:
                        raise ValueError(f"{key} needs two values")
                    (p.eq_labels if key == "EQ_LABEL" else p.eq_words).append((pair[0], pair[1]))
                else:
                    raise ValueError(f"unknown or unsupported keyword {key!r}")
            except ValueError as e:
                raise NmtError(f"{path}: line {lineno}: {e}") from None
        return p

    def label_eq(self, a: str, b: str) -> bool:
        return a == b or any((a, b) in ((x, y), (y, x)) for x, y in self.eq_labels)

    def word_eq(self, a: str, b: str) -> bool:
        return a == b or any((a, b) in ((x, y), (y, x)) for x, y in self.eq_words)


@dataclass
class _Parsed:
    terminals: list[tuple[str, str]]      # (word, label) after deleting DELETE_LABEL terminals
    brackets: list[list]                  # [start, end, label]
    length: int                           # words not labelled DELETE_LABEL_FOR_LENGTH
    errors: list[str]


class _Abort(Exception):
    """EVALB would loop on this line until it exits."""


def _read_line(line: str, params: EvalbParams) -> _Parsed:
    """Scan one tree line the way EVALB's reader does (not a general tree parser on purpose)."""
    terms: list[tuple[str, str]] = []
    brackets: list[list] = []
    errors: list[str] = []
    stack: list[int] = []
    length = 0
    # fgets() leaves the newline in EVALB's buffer, and what happens at the end of a line
    # (e.g. which error an unclosed "(S" raises) depends on it.
    line = line + "\n"
    n, i = len(line), 0
    while i < n:
        c = line[i]
        if c in _WS:
            i += 1
        elif c == "(":
            j = i + 1
            while j < n and line[j] not in _TERMINATORS:
                j += 1
            label = line[i + 1:j]
            i = j
            if i < n and line[i] in _WS:
                q = i
                while q < n and line[q] in _WS:
                    q += 1
                k = q
                while k < n and line[k] not in _TERMINATORS:
                    k += 1
                word = line[q:k]
                if k < n and line[k] == ")":
                    if label not in params.delete_labels_for_length:
                        length += 1
                    if label not in params.delete_labels:
                        terms.append((word, label))
                    i = k + 1
                    continue
                if k < n and line[k] != "(" or k >= n and word:
                    # EVALB reports "More than two elements in a bracket", then cannot read on.
                    raise _Abort(f"more than two elements in a bracket: ({label} {word} ...")
                if k >= n:
                    errors.append("More than two elements in a bracket")
            brackets.append([len(terms), -1, label])
            stack.append(len(brackets) - 1)
        elif c == ")":
            if not stack:
                errors.append("Bracketing unbalance (too many close bracket)")
            else:
                brackets[stack.pop()][1] = len(terms)
            i += 1
        else:
            raise _Abort(f"text outside a bracket at character {i + 1}")
    if stack:
        errors.append("Bracketing is unbalanced (too many open bracket)")
    return _Parsed(terms, brackets, length, errors)


def _modify_label(label: str) -> str:
    for k, ch in enumerate(label):
        if ch in "-=":
            return label[:k]
    return label


def retag_xx(gold_line: str, test_line: str, params: EvalbParams) -> str:
    """Put the gold POS tags in place of the test tree's ``XX`` tags.

    Only when the test tree has as many terminals as the gold one has non-empty ones.
    """
    test_terms = _TERMINAL.findall(test_line)
    if not any(label == "XX" for label, _ in test_terms):
        return test_line
    gold_tags = [label for label, _ in _TERMINAL.findall(gold_line)
                 if label not in params.delete_labels_for_length]
    if len(gold_tags) != len(test_terms):
        return test_line
    it = iter(gold_tags)

    def sub(m: re.Match) -> str:
        tag = next(it)
        return m.group(0) if m.group(1) != "XX" else "(" + tag + m.group(0)[1 + len("XX"):]

    return _TERMINAL.sub(sub, test_line)


@dataclass
class SentenceScore:
    line: int
    length: int           # gold words without -NONE- (decides len<=CUTOFF_LEN)
    status: int           # 0 ok, 1 error, 2 skip
    match: int = 0
    gold: int = 0         # brackets counted in gold
    test: int = 0         # brackets counted in test
    crossing: int = 0
    words: int = 0        # words compared (after deletions)
    correct_tags: int = 0
    message: str = ""

    @property
    def recall(self) -> float:
        return 100.0 * self.match / self.gold if self.gold else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.match / self.test if self.test else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0


@dataclass
class Summary:
    sentences: int = 0
    error_sentences: int = 0
    skip_sentences: int = 0
    match: int = 0
    gold: int = 0
    test: int = 0
    exact: int = 0
    words: int = 0
    crossing: int = 0
    no_crossing: int = 0
    two_or_less_crossing: int = 0
    correct_tags: int = 0

    def add(self, s: SentenceScore) -> None:
        self.sentences += 1
        if s.status == ERROR:
            self.error_sentences += 1
        elif s.status == SKIP:
            self.skip_sentences += 1
        else:
            self.match += s.match
            self.gold += s.gold
            self.test += s.test
            self.exact += s.gold == s.test == s.match
            self.words += s.words
            self.crossing += s.crossing
            self.no_crossing += s.crossing == 0
            self.two_or_less_crossing += s.crossing <= 2
            self.correct_tags += s.correct_tags

    @property
    def valid(self) -> int:
        return self.sentences - self.error_sentences - self.skip_sentences

    @property
    def recall(self) -> float:
        return 100.0 * self.match / self.gold if self.gold > 0 else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.match / self.test if self.test > 0 else 0.0

    @property
    def f1(self) -> float:
        """EVALB's 2PR/(P+R) on unrounded percentages; 0.0 where EVALB prints nan."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    @property
    def exact_match(self) -> float:
        return 100.0 * self.exact / self.valid if self.valid > 0 else 0.0

    @property
    def average_crossing(self) -> float:
        return self.crossing / self.valid if self.valid > 0 else 0.0

    @property
    def tagging_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words > 0 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(valid_sentences=self.valid, recall=self.recall, precision=self.precision,
                 f1=self.f1, exact_match=self.exact_match, average_crossing=self.average_crossing,
                 tagging_accuracy=self.tagging_accuracy)
        return d


@dataclass
class EvalbResult:
    sentences: list[SentenceScore]
    all: Summary
    short: Summary        # sentences with length <= cutoff
    cutoff: int
    errors: list[str]     # "line N: message", as EVALB writes them on stderr

    def to_dict(self) -> dict:
        return {"all": self.all.to_dict(), f"len<={self.cutoff}": self.short.to_dict(),
                "cutoff_len": self.cutoff}


def _score_sentence(lineno: int, gold: _Parsed, test: _Parsed, params: EvalbParams,
                    errors: list[str]) -> SentenceScore:
    status = ERROR if gold.errors or test.errors else OK
    for msg in gold.errors + test.errors:
        errors.append(f"line {lineno}: {msg}")
    s = SentenceScore(lineno, gold.length, status)
    if not test.terminals:
        s.status = SKIP
        return s
    if len(gold.terminals) != len(test.terminals):
        errors.append(f"line {lineno}: Length unmatch "
                      f"({len(gold.terminals)}|{len(test.terminals)})")
        s.status, s.message = ERROR, errors[-1]
        return s
    for (gw, _), (tw, _) in zip(gold.terminals, test.terminals):
        if not params.word_eq(gw, tw):
            errors.append(f"line {lineno}: Words unmatch ({gw}|{tw})")
            s.status, s.message = ERROR, errors[-1]
            return s

    def counted(brackets: list[list]) -> list[list | None]:
        out: list[list | None] = []
        for start, end, label in brackets:
            if start == end:
                out.append(None)
                continue
            label = _modify_label(label)
            deleted = any(params.label_eq(label, d) for d in params.delete_labels)
            out.append(None if deleted else [start, end, label])
        return out

    g, t = counted(gold.brackets), counted(test.brackets)
    used = [False] * len(t)
    match = 0
    for gb in g:
        if gb is None:
            continue
        for j, tb in enumerate(t):
            if tb is not None and not used[j] and tb[0] == gb[0] and tb[1] == gb[1] \
                    and (not params.labeled or params.label_eq(gb[2], tb[2])):
                used[j] = True
                match += 1
                break
    crossing = 0
    # Crossing is counted per test bracket (a test bracket crossing any gold one counts once).
    for tb in t:
        if tb is None:
            continue
        for gb in g:
            if gb is not None and (gb[0] < tb[0] < gb[1] < tb[1] or tb[0] < gb[0] < tb[1] < gb[1]):
                crossing += 1
                break
    s.match, s.crossing = match, crossing
    s.gold = sum(b is not None for b in g)
    s.test = sum(b is not None for b in t)
    s.words = len(gold.terminals)
    s.correct_tags = sum(params.label_eq(gl, tl) for (_, gl), (_, tl)
                         in zip(gold.terminals, test.terminals))
    return s


def _read_or_stop(line: str, params: EvalbParams, name: str, lineno: int):
    """A tree of ``name`` (the file); an unreadable one stops scoring, as it stops EVALB."""
    try:
        return _read_line(line, params)
    except _Abort as e:
        raise NmtError(f"{name}: line {lineno}: unreadable tree ({e}); EVALB would stop "
                       f"here") from None


def evaluate(gold_lines: Sequence[str], test_lines: Sequence[str],
          params: EvalbParams | None = None, retag: bool = True,
          names: tuple[str, str] = ("gold", "test")) -> EvalbResult:
    """Score test trees against gold trees (one per line, same number of lines)."""
    params = params or EvalbParams.collins()
    if len(gold_lines) != len(test_lines):
        raise NmtError(f"{names[1]} has {len(test_lines)} lines but {names[0]} has "
                       f"{len(gold_lines)}: expected one tree per gold line")
    result = EvalbResult([], Summary(), Summary(), params.cutoff_len, [])
    for lineno, (gl, tl) in enumerate(zip(gold_lines, test_lines), 1):
        if retag:
            tl = retag_xx(gl, tl, params)
        n_before = len(result.errors)
        g = _read_or_stop(gl, params, names[0], lineno)
        t = _read_or_stop(tl, params, names[1], lineno)
        s = _score_sentence(lineno, g, t, params, result.errors)
        result.sentences.append(s)
        result.all.add(s)
        if s.length <= params.cutoff_len:
            result.short.add(s)
        # EVALB exits once its error counter passes MAX_ERROR (it checks count++ > max).
        if params.max_error is not None and len(result.errors) > params.max_error + 1 \
                and len(result.errors) > n_before:
            raise NmtError(f"line {lineno}: {len(result.errors)} errors, more than MAX_ERROR "
                           f"{params.max_error} allows; EVALB stops here (last: "
                           f"{result.errors[-1]}); see --max-errors")
    return result


def evaluate_files(gold_path: str | os.PathLike, test_path: str | os.PathLike | None,
                params: EvalbParams | None = None, retag: bool = True) -> EvalbResult:
    gold = list(iter_lines(gold_path))
    test = list(iter_lines(test_path))
    return evaluate(gold, test, params, retag, (str(gold_path), str(test_path or "<stdin>")))


def _f1_text(s: Summary) -> str:
    p, r = s.precision, s.recall
    # C's 0.0/0.0 is a negative NaN on x86, which glibc prints as "-nan".
    return f"{2 * p * r / (p + r):6.2f}" if p + r > 0 else "  -nan"


def format_report(result: EvalbResult) -> str:
    """The text EVALB prints on stdout: the per-sentence table, the totals and the summary."""
    out = ["  Sent.                        Matched  Bracket   Cross        Correct Tag",
           " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy",
           "=" * 76]
    for s in result.sentences:
        out.append(f"{s.line:4d}  {s.length:3d}    {s.status:d}  "
                   f"{s.recall:6.2f} {s.precision:6.2f}   {s.match:3d}    {s.gold:3d}  "
                   f"{s.test:3d}    "
                   f"{s.crossing:3d}   {s.words:4d}  {s.correct_tags:4d}   "
                   f"{(100.0 * s.correct_tags / s.words if s.words else 0.0):6.2f}")
    out.append("=" * 76)
    a = result.all
    line = ""
    if a.gold > 0 and a.test > 0:
        line += (f"                {a.recall:6.2f} {a.precision:6.2f} {a.match:6d} {a.gold:5d} "
                 f"{a.test:5d}  {a.crossing:5d}")
    line += f"  {a.words:5d} {a.correct_tags:5d}   {a.tagging_accuracy:6.2f}"
    out += [line, "=== Summary ==="]
    for title, s in (("-- All --", a), (f"-- len<={result.cutoff} --", result.short)):
        valid = s.valid
        out += ["", title,
                f"Number of sentence        = {s.sentences:6d}",
                f"Number of Error sentence  = {s.error_sentences:6d}",
                f"Number of Skip  sentence  = {s.skip_sentences:6d}",
                f"Number of Valid sentence  = {valid:6d}",
                f"Bracketing Recall         = {s.recall:6.2f}",
                f"Bracketing Precision      = {s.precision:6.2f}",
                f"Bracketing FMeasure       = {_f1_text(s)}",
                f"Complete match            = {s.exact_match:6.2f}",
                f"Average crossing          = {s.average_crossing:6.2f}",
                f"No crossing               = "
                f"{(100.0 * s.no_crossing / valid if valid > 0 else 0.0):6.2f}",
                f"2 or less crossing        = "
                f"{(100.0 * s.two_or_less_crossing / valid if valid > 0 else 0.0):6.2f}",
                f"Tagging accuracy          = {s.tagging_accuracy:6.2f}"]
    return "\n".join(out) + "\n"

