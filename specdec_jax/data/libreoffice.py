"""LibreOffice help pages (compiled HTML) -> aligned English-German paragraph pairs.

The Debian packages `libreoffice-help-en-us` and `libreoffice-help-de` ship the same help
pages under `usr/share/libreoffice/help/<lang>/text/<module>/...html`. Every translatable
paragraph (`<p>`, `<h1>`..`<h6>`) carries an `id` such as `par_id3147762` or
`hd_id701641581066778` that is identical in both languages, so paragraphs are aligned by
(page path, paragraph id, occurrence of that id in the page).

Cleaning:
  * markup is removed, only text is kept; `<img>` alt texts are dropped;
  * inline switches (`<span class="switchinline">` / `class="switch"`) hold one hidden
    `<span>` per platform or application (MAC, WIN, CALC, WRITER, ...) plus a `default...`
    variant. Only the default variant is kept (so "Command"/"Ctrl" yields "Ctrl"); a switch
    without a default variant contributes nothing;
  * whitespace is collapsed.
"""

from __future__ import annotations

import dataclasses
import html.parser
import os
import re
from collections.abc import Iterator

from specdec_jax.data import corpora

HELP_ROOTS = {"en": "usr/share/libreoffice/help/en-US", "de": "usr/share/libreoffice/help/de"}
_PARAGRAPH_TAGS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6"})
_PARAGRAPH_ID = re.compile(r"^(par|hd)_id\w+$")
_VOID_TAGS = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
    "source", "track", "wbr",
})
_SWITCH_CLASSES = frozenset({"switch", "switchinline"})
_SPACE = re.compile(r"\s+")


@dataclasses.dataclass(frozen=True)
class Paragraph:
  """One cleaned help paragraph.

  Attributes:
    page: path of the page relative to the language root, e.g. "text/scalc/01/func_sum.html".
    key: "<id>#<n>", the paragraph id and its occurrence index n within the page.
    text: cleaned text (may be empty).
  """
  page: str
  key: str
  text: str


@dataclasses.dataclass
class _Open:
  tag: str
  skip: bool  # True for a non-default variant of a switch: its text is dropped.
  is_switch: bool
  paragraph: int | None  # Index into `paragraphs` when this element is an aligned paragraph.


class _HelpPageParser(html.parser.HTMLParser):
  """Collects (id, cleaned text) of every paragraph element of one help page."""

  def __init__(self) -> None:
    super().__init__(convert_charrefs=True)
    self.paragraphs: list[tuple[str, list[str]]] = []  # (id, text pieces) in document order.
    self._stack: list[_Open] = []

  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    if tag in _VOID_TAGS:
      if tag == "br":
        self.handle_data(" ")
      return
    attr = {k: (v or "") for k, v in attrs}
    parent_is_switch = bool(self._stack) and self._stack[-1].is_switch
    skip = parent_is_switch and not attr.get("id", "").startswith("default")
    is_switch = bool(_SWITCH_CLASSES & set(attr.get("class", "").split()))
    paragraph = None
    if tag in _PARAGRAPH_TAGS and _PARAGRAPH_ID.match(attr.get("id", "")):
      paragraph = len(self.paragraphs)
      self.paragraphs.append((attr["id"], []))
    self._stack.append(_Open(tag, skip, is_switch, paragraph))

  def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    del tag, attrs  # Self-closing elements carry no text.

  def handle_endtag(self, tag: str) -> None:
    if tag in _VOID_TAGS or all(o.tag != tag for o in self._stack):
      return
    while self._stack.pop().tag != tag:
      pass

  def handle_data(self, data: str) -> None:
    # Text goes to the innermost open paragraph unless a skipped switch variant lies between
    # that paragraph and the text (a skipped variant *around* a paragraph does not drop it).
    for frame in reversed(self._stack):
      if frame.skip:
        return
      if frame.paragraph is not None:
        self.paragraphs[frame.paragraph][1].append(data)
        return


def clean_text(text: str) -> str:
  """Collapses whitespace and strips `text`."""
  return _SPACE.sub(" ", text).strip()


def parse_help_page(html_text: str, page: str) -> list[Paragraph]:
  """Parses one help page into its paragraphs, in document order.

  Args:
    html_text: the page's HTML.
    page: the page path used as `Paragraph.page`.

  Returns:
    The paragraphs; repeated ids get increasing occurrence indices in their keys.
  """
  parser = _HelpPageParser()
  parser.feed(html_text)
  parser.close()
  seen: dict[str, int] = {}
  out = []
  for pid, pieces in parser.paragraphs:
    n = seen.get(pid, 0)
    seen[pid] = n + 1
    out.append(Paragraph(page=page, key=f"{pid}#{n}", text=clean_text("".join(pieces))))
  return out


def find_help_root(unpacked_dir: str, lang: str) -> str:
  """Returns the help root of language `lang` ("en" or "de") inside an unpacked package."""
  root = os.path.join(unpacked_dir, HELP_ROOTS[lang])
  if not os.path.isdir(os.path.join(root, "text")):
    raise FileNotFoundError(
        f"unpacked_dir={unpacked_dir!r} has no {HELP_ROOTS[lang]}/text: pass the directory "
        f"into which the libreoffice-help package for '{lang}' was unpacked.")
  return root


def read_help_pages(help_root: str) -> dict[str, dict[str, str]]:
  """Parses every page under `<help_root>/text`.

  Returns:
    {page path relative to help_root: {paragraph key: cleaned text}}, pages sorted by path.
  """
  pages = {}
  text_root = os.path.join(help_root, "text")
  paths = sorted(
      os.path.join(d, f) for d, _, files in os.walk(text_root) for f in files
      if f.endswith(".html"))
  for path in paths:
    page = os.path.relpath(path, help_root).replace(os.sep, "/")
    with open(path, encoding="utf-8") as f:
      pages[page] = {p.key: p.text for p in parse_help_page(f.read(), page)}
  return pages


def align_pages(
    en_pages: dict[str, dict[str, str]], de_pages: dict[str, dict[str, str]]
) -> Iterator[tuple[str, str, str, str]]:
  """Yields (page, key, english, german) for paragraphs present and non-empty in both.

  Pairs whose English text has no letter (numbers, symbols) or whose two sides are
  identical (untranslated names, formulas) are dropped. Order: page, then document order.
  """
  for page in sorted(en_pages):
    de = de_pages.get(page, {})
    for key, en_text in en_pages[page].items():
      de_text = de.get(key, "")
      if not en_text or not de_text or en_text == de_text:
        continue
      if not any(c.isalpha() for c in en_text):
        continue
      yield page, key, en_text, de_text



def build_examples(en_unpacked: str, de_unpacked: str) -> list[corpora.Example]:
  """English->German examples from the two unpacked help packages.

  Each example's `page` is the help page path and its `id` is "<page>#<paragraph key>".
  """
  en_pages = read_help_pages(find_help_root(en_unpacked, "en"))
  de_pages = read_help_pages(find_help_root(de_unpacked, "de"))
  return [corpora.Example(id=f"{page}#{key}", inputs=en, targets=de, page=page)
          for page, key, en, de in align_pages(en_pages, de_pages)]
