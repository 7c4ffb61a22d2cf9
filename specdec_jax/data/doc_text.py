"""Documentation files of unpacked Debian packages -> documents of plain-prose paragraphs.

Each reader understands only what its format needs to yield running English text:
  * man pages (roff): every section but NAME and SYNOPSIS (`manpages.roff_to_sections`);
  * reStructuredText and plain text (the kernel's and Python's documentation): paragraphs
    between blank lines, without titles' underlines, directives, field lists, literal
    blocks (after `::`) and indented code; inline roles and quotes become their text;
  * HTML (PostgreSQL's, debian-reference, bash's manual): the text of `<p>`, `<li>`, `<dd>`
    and `<td>` elements, outside `<pre>`, `<script>` and `<style>`;
  * Perl's POD: text paragraphs, formatting codes (`C<...>`, `L<text|link>`) resolved;
  * WordNet's data files: each synset's words and gloss.
A paragraph is kept when it reads as prose (`is_prose`): enough words, mostly letters.
Numpy-free and TensorFlow-free.
"""

from __future__ import annotations

import dataclasses
import gzip
import html
import html.parser
import os
import re
from collections.abc import Iterator

from specdec_jax.data import manpages

_SPACE = re.compile(r"\s+")
# Sections of a man page that are not running text.
_MAN_SKIP = frozenset({"NAME", "SYNOPSIS"})


@dataclasses.dataclass(frozen=True)
class Document:
  """One page, file or synset of a package's documentation.

  Attributes:
    package: the Debian package it comes from.
    name: its name inside the package (a man page "man1/bash.1", a file's path).
    title: a short title (a man page's one-liner, a file's first heading).
    paragraphs: its prose paragraphs, in order, whitespace collapsed.
  """
  package: str
  name: str
  title: str
  paragraphs: tuple[str, ...]


def is_prose(text: str, min_words: int = 8) -> bool:
  """Whether `text` reads as running prose: >= `min_words` words, >= 75% letters or spaces
  among its characters, and at most one word in six with code punctuation in it."""
  words = text.split()
  if len(words) < min_words:
    return False
  letters = sum(c.isalpha() or c == " " for c in text)
  if letters < 0.75 * len(text):
    return False
  code = sum(bool(re.search(r"[{}\[\]<>=;$|\\_/]|::|\(\)", w)) for w in words)
  return code * 6 <= len(words)


def _clean(text: str) -> str:
  return _SPACE.sub(" ", text).strip()


def _read(path: str) -> str:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt", encoding="utf-8", errors="replace") as f:
    return f.read()


# --- man pages ---------------------------------------------------------------------------

def man_documents(unpacked_dir: str, package: str) -> Iterator[Document]:
  """The English man pages of an unpacked package (none if it ships no man pages)."""
  if not os.path.isdir(os.path.join(unpacked_dir, manpages.MAN_ROOT)):
    return
  for page, source in manpages.iter_man_sources(unpacked_dir):
    sections = manpages.roff_to_sections(source)
    paragraphs = tuple(p for name, texts in sections.items() if name not in _MAN_SKIP
                       for p in texts if is_prose(p))
    if paragraphs:
      title = manpages.name_summary(sections.get("NAME", [])) or page
      yield Document(package, page, title, paragraphs)


# --- reStructuredText and plain text -----------------------------------------------------

_UNDERLINE = re.compile(r"^\s*([=\-~^\"'`#*+.:_])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^\s*\.\.\s")
_FIELD = re.compile(r"^\s*:[\w \-]+:(\s|$)")
_ROLE = re.compile(r":[\w:+\-]+:`([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]*)``")
_REFERENCE = re.compile(r"`([^`<]*?)(?:\s*<[^>]*>)?`_{0,2}")
_EMPHASIS = re.compile(r"\*\*?([^*]+)\*\*?")


def rst_inline(text: str) -> str:
  """reStructuredText inline markup replaced by its text."""
  text = _ROLE.sub(r"\1", text)
  text = _LITERAL.sub(r"\1", text)
  text = _REFERENCE.sub(r"\1", text)
  return _EMPHASIS.sub(r"\1", text)


def rst_paragraphs(source: str) -> tuple[str, list[str]]:
  """(first title, prose paragraphs) of a reStructuredText or plain-text file."""
  title, paragraphs, block = "", [], []
  literal = False  # Inside the indented block that a paragraph ending in "::" introduces.

  def flush() -> None:
    nonlocal title, literal
    lines = [ln for ln in block if not _UNDERLINE.match(ln)]
    underlined = len(lines) < len(block)
    block.clear()
    if not lines:
      return
    if underlined and len(lines) == 1:  # A section title.
      title = title or _clean(rst_inline(lines[0]))
      return
    if _DIRECTIVE.match(lines[0]) or _FIELD.match(lines[0]) or lines[0].startswith((" ", "\t")):
      literal = literal and lines[0].startswith((" ", "\t"))
      return
    text = _clean(rst_inline(" ".join(lines)))
    literal = text.endswith("::")
    text = text[:-1] if literal else text
    if is_prose(text):
      paragraphs.append(text)

  for line in source.splitlines():
    if line.strip():
      if literal and not block and not line.startswith((" ", "\t")):
        literal = False
      if not literal:
        block.append(line.rstrip())
    else:
      flush()
  flush()
  return title, paragraphs


# --- HTML --------------------------------------------------------------------------------

class _HtmlText(html.parser.HTMLParser):
  """Collects the text of block elements, outside preformatted and invisible ones."""

  _BLOCKS = frozenset({"p", "li", "dd", "td", "blockquote"})
  _HIDDEN = frozenset({"pre", "script", "style", "head"})
  _HEADINGS = frozenset({"h1", "h2", "h3", "title"})

  def __init__(self) -> None:
    super().__init__(convert_charrefs=True)
    self.paragraphs: list[str] = []
    self.title = ""
    self._hidden = 0
    self._depth = 0  # Open block elements.
    self._heading = False
    self._words: list[str] = []

  def _flush(self) -> None:
    text = _clean(" ".join(self._words))
    self._words.clear()
    if text:
      self.paragraphs.append(text)

  def handle_starttag(self, tag: str, attrs: list) -> None:
    if tag in self._HIDDEN:
      self._hidden += 1
    elif tag in self._BLOCKS:
      if self._depth:
        self._flush()
      self._depth += 1
    elif tag in self._HEADINGS:
      self._heading = True

  def handle_endtag(self, tag: str) -> None:
    if tag in self._HIDDEN:
      self._hidden = max(0, self._hidden - 1)
    elif tag in self._BLOCKS and self._depth:
      self._depth -= 1
      self._flush()
    elif tag in self._HEADINGS:
      self._heading = False

  def handle_data(self, data: str) -> None:
    if self._hidden:
      return
    if self._heading and not self.title and data.strip():
      self.title = _clean(data)
    elif self._depth:
      self._words.append(data)


def html_paragraphs(source: str) -> tuple[str, list[str]]:
  """(first heading, prose paragraphs) of an HTML page."""
  parser = _HtmlText()
  parser.feed(source)
  parser.close()
  return parser.title, [p for p in parser.paragraphs if is_prose(p)]


# --- POD ---------------------------------------------------------------------------------

_POD_CODE = re.compile(r"[BICFSXZE]<(?:<+\s(.*?)\s>+|([^<>]*))>")
_POD_LINK = re.compile(r"L<(?:<+\s(.*?)\s>+|([^<>]*))>")


def _pod_inline(text: str) -> str:
  for _ in range(4):  # Nested codes (B<C<x>>) resolve from the inside out.
    text = _POD_LINK.sub(lambda m: (m.group(1) or m.group(2) or "").split("|")[0], text)
    text = _POD_CODE.sub(lambda m: html.unescape(
        f"&{m.group(2)};") if m.group(0).startswith("E<") else (m.group(1) or m.group(2) or ""),
        text)
  return text


def pod_paragraphs(source: str) -> tuple[str, list[str]]:
  """(NAME's text, prose paragraphs) of a POD file: verbatim and command paragraphs
  are dropped (a `=head1 NAME`'s following paragraph becomes the title)."""
  title, paragraphs, after_name, in_pod = "", [], False, True
  for block in re.split(r"\n\s*\n", source):
    if not block.strip():
      continue
    if block.startswith("="):
      command = block.split(None, 1)[0]
      in_pod = command != "=cut" and command not in ("=begin", "=for")
      after_name = block.startswith("=head1 NAME")
      continue
    if not in_pod or block.startswith((" ", "\t")):
      continue
    text = _clean(_pod_inline(block))
    if after_name:
      title, after_name = text, False
    elif is_prose(text):
      paragraphs.append(text)
  return title, paragraphs


# --- WordNet -----------------------------------------------------------------------------

def wordnet_documents(unpacked_dir: str, package: str) -> Iterator[Document]:
  """One document per WordNet synset with a gloss of prose: its words and its gloss."""
  root = os.path.join(unpacked_dir, "usr/share/wordnet")
  for pos in ("noun", "verb", "adj", "adv"):
    path = os.path.join(root, f"data.{pos}")
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        if line.startswith(" ") or "|" not in line:
          continue
        head, gloss = line.split("|", 1)
        fields = head.split()
        count = int(fields[3], 16)
        words = [fields[4 + 2 * i].replace("_", " ") for i in range(count)]
        text = _clean(gloss)
        if is_prose(text, min_words=6):
          yield Document(package, f"{pos}/{fields[0]}", ", ".join(words), (text,))


# --- files of a package ------------------------------------------------------------------

_READERS = {"rst": rst_paragraphs, "html": html_paragraphs, "pod": pod_paragraphs}


def file_documents(unpacked_dir: str, package: str, kind: str, root: str, suffixes: tuple[str, ...]
                   ) -> Iterator[Document]:
  """Documents of the files under `<unpacked_dir>/<root>` ending in `suffixes`, read as
  `kind` ("rst", "html" or "pod"), in sorted path order."""
  reader = _READERS[kind]
  base = os.path.join(unpacked_dir, root)
  paths = []
  for directory, _, names in os.walk(base):
    paths.extend(os.path.join(directory, n) for n in names if n.endswith(suffixes))
  for path in sorted(paths):
    if os.path.islink(path):
      continue
    title, paragraphs = reader(_read(path))
    if paragraphs:
      name = os.path.relpath(path, base)
      yield Document(package, name, title or name, tuple(paragraphs))
