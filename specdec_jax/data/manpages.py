"""Linux man pages (roff sources) -> (DESCRIPTION text, NAME one-liner) summarization pairs.

Only what these pages use is understood: `.SH`/`.SS` sections, font and paragraph macros
(`.B`, `.BR`, `.I`, `.IR`, `.PP`, `.TP`, `.IP`, ...), comments, and the common escapes
(`\\fB`, `\\-`, `\\(em`, `\\[...]`, `\\*(lq`, ...). Tables (`.TS`/`.TE`) and code examples
(`.EX`/`.EE`) are dropped from the text; every other request is ignored.
"""

from __future__ import annotations

import gzip
import os
import re
import shlex
from collections.abc import Iterator

from specdec_jax.data import corpora

MAN_ROOT = "usr/share/man"

# Macros whose arguments alternate fonts without spaces between them.
_ALTERNATING = frozenset({"BR", "RB", "BI", "IB", "IR", "RI"})
# Macros whose arguments are joined by spaces.
_FONT = frozenset({"B", "I", "SM", "SB"})
# Macros that start a new paragraph.
_BREAK = frozenset({"PP", "P", "LP", "TP", "TQ", "IP", "HP", "sp", "br", "SS"})
# Named characters (`\(xx`, `\[xx]`, `\*(xx`, `\*[xx]`).
_NAMED = {
    "em": "—", "en": "–", "hy": "-", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘",
    "cq": "’", "bu": "•", "co": "©", "rg": "®", "tm": "™", "mu": "×", "di": "÷", "<=": "≤",
    ">=": "≥", "!=": "≠", "+-": "±", "ti": "~", "ha": "^", "rs": "\\", "sl": "/", "ga": "`",
    "aa": "´", "ra": "→", "la": "←", "rA": "⇒", "lA": "⇐", "de": "°", "R": "®", "Tm": "™",
    "ba": "|", "or": "|", "pl": "+", "mi": "−", "eq": "=", "ua": "↑", "da": "↓", "ss": "ß",
    ":a": "ä", ":o": "ö", ":u": "ü", "'e": "é", "`e": "è", "*a": "α", "*b": "β", "*m": "μ",
    "*p": "π", "if": "∞", "sr": "√", "ca": "∩", "cu": "∪", "lB": "[", "rB": "]",
    "lC": "{", "rC": "}", "fo": "‹", "fc": "›", "Fo": "«", "Fc": "»",
}
_ESCAPE = re.compile(
    r"\\(?:"
    r"f(?:\[[^\]]*\]|\([A-Za-z]{2}|.)"  # font change
    r"|s[-+]?(?:\d|\(\d\d|\[\d+\])"  # size change
    r"|\*?\((?P<p2>..)"  # \(xx or \*(xx
    r"|\*?\[(?P<br>[^\]]*)\]"  # \[xx] or \*[xx]
    r"|\*(?P<s1>.)"  # \*x
    r"|(?P<ch>.)"  # one-character escapes
    r")")
_ONE_CHAR = {"-": "-", "e": "\\", "\\": "\\", "~": " ", " ": " ", "0": " ", "t": " ",
             "&": "", "|": "", "^": "", "%": "", "c": "", ":": "", "/": "", ",": "", ")": "",
             "'": "´", "`": "`", ".": "."}
_SPACE = re.compile(r"\s+")


def _named(name: str) -> str:
  if name.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}", name):
    return chr(int(name[1:], 16))
  return _NAMED.get(name, "")


def unescape(text: str) -> str:
  """Replaces roff escapes in one line of text by the characters they denote."""

  def sub(m: re.Match[str]) -> str:
    if m.group("p2") is not None:
      return _named(m.group("p2"))
    if m.group("br") is not None:
      return _named(m.group("br"))
    if m.group("s1") is not None:
      return _named(m.group("s1"))
    if m.group("ch") is not None:
      return _ONE_CHAR.get(m.group("ch"), "")
    return ""  # font or size change

  return _ESCAPE.sub(sub, text)


def _strip_comment(line: str) -> str:
  # `\"` starts a comment, `\\"` is an escaped backslash followed by a quote.
  m = re.search(r'(?<!\\)(?:\\\\)*\\"', line)
  return line[:m.end() - 2] if m else line


def _macro_args(rest: str) -> list[str]:
  try:
    return shlex.split(rest.replace("\\", "\\\\"), posix=True)
  except ValueError:  # Unbalanced quote: roff takes the rest of the line.
    return rest.split()


def _macro_text(name: str, rest: str) -> str | None:
  """Text contributed by a macro line, or None when the macro carries no text."""
  args = _macro_args(rest)
  if name in _ALTERNATING:
    return "".join(args)
  if name in _FONT:
    return " ".join(args)
  return None


def roff_to_sections(source: str) -> dict[str, list[str]]:
  """Splits a man page into sections of plain-text paragraphs.

  Args:
    source: the roff source of one page.

  Returns:
    {section name in upper case: [paragraph text, ...]}, sections in page order.
  """
  sections: dict[str, list[str]] = {}
  current: list[str] | None = None
  words: list[str] = []
  skipping = ""  # The request that ends a dropped block (".TE" or ".EE"), if inside one.

  def flush() -> None:
    if current is not None and words:
      text = _SPACE.sub(" ", unescape(" ".join(words))).strip()
      if text:
        current.append(text)
    words.clear()

  for raw in source.splitlines():
    line = _strip_comment(raw)
    if skipping:
      if line.strip() == skipping:
        skipping = ""
      continue
    if line.startswith((".", "'")):
      name, rest = (line[1:].strip().split(None, 1) + ["", ""])[:2]
      if name == "SH":
        flush()
        current = sections.setdefault(" ".join(_macro_args(rest)).upper(), [])
      elif name == "TS":
        skipping = ".TE"
      elif name == "EX":
        skipping = ".EE"
      elif name in _BREAK:
        flush()
        if name == "SS" or (name == "IP" and rest and not rest.startswith("\\(bu")):
          tag = _macro_args(rest)[:1] if name == "IP" else [" ".join(_macro_args(rest))]
          words.extend(tag)
          if name == "SS":
            flush()
      else:
        text = _macro_text(name, rest)
        if text:
          words.append(text)
    elif line.strip():
      words.append(line.strip())
  flush()
  return sections


def name_summary(name_paragraphs: list[str]) -> str:
  """The one-liner of a NAME section: the text after the dash ("printf \\- formatted...")."""
  text = " ".join(name_paragraphs)
  for dash in (" - ", " — ", " – "):
    if dash in text:
      return text.split(dash, 1)[1].strip()
  return ""


def page_pair(source: str) -> tuple[str, str] | None:
  """(DESCRIPTION text, NAME one-liner) of one page, or None if it lacks either."""
  sections = roff_to_sections(source)
  summary = name_summary(sections.get("NAME", []))
  description = " ".join(sections.get("DESCRIPTION", []))
  if not summary or not description:
    return None
  return description, summary


def iter_man_sources(unpacked_dir: str) -> Iterator[tuple[str, str]]:
  """Yields (page, roff source) of every real page of an unpacked manpages package.

  `page` is e.g. "man3/printf.3". Symbolic links and `.so` redirections (aliases of other
  pages) are skipped so that each page is read once. Order: sorted by page.
  """
  root = os.path.join(unpacked_dir, MAN_ROOT)
  if not os.path.isdir(root):
    raise FileNotFoundError(
        f"unpacked_dir={unpacked_dir!r} has no {MAN_ROOT}: pass the directory into which a "
        "manpages package was unpacked.")
  entries = []
  for section in sorted(os.listdir(root)):
    section_dir = os.path.join(root, section)
    if not section.startswith("man") or not os.path.isdir(section_dir):
      continue
    for name in sorted(os.listdir(section_dir)):
      path = os.path.join(section_dir, name)
      if os.path.islink(path) or not os.path.isfile(path):
        continue
      page = f"{section}/{name[:-3] if name.endswith('.gz') else name}"
      entries.append((page, path))
  for page, path in sorted(entries):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
      source = f.read()
    if any(line.startswith(".so ") for line in source.splitlines()[:40]
           if not line.startswith('.\\"')):
      continue
    yield page, source


def build_examples(unpacked_dirs: list[str]) -> list[corpora.Example]:
  """DESCRIPTION -> NAME one-liner examples from unpacked manpages packages.

  Each example's `page` and `id` are the page name, e.g. "man3/printf.3".
  """
  examples = []
  for unpacked in unpacked_dirs:
    for page, source in iter_man_sources(unpacked):
      pair = page_pair(source)
      if pair is not None:
        examples.append(corpora.Example(id=page, inputs=pair[0], targets=pair[1], page=page))
  return examples
