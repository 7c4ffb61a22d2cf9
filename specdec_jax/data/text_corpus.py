"""In-domain English text at scale, from Debian packages, as chat-shaped training examples.

A draft trained the EAGLE way reads the target's features along a fixed text, computed by
teacher forcing (a prefill), instead of outputs the target decoded. This module chooses
that text: the man pages of many packages, the LibreOffice help's training pages (the
"explain" task's own domain), and the documentation of Python, the Linux kernel,
PostgreSQL, Perl, bash, debian-reference and WordNet's glosses (`SOURCES`), read by
`doc_text`. Each document's paragraphs are packed into chunks of about `CHUNK_WORDS`
words; consecutive chunks make one example whose user turn asks, in one of the two
tasks' instructions (`chat_prompts.TASKS`: "mansum", "explain"), about the first, and
whose assistant turn is the second (a document of one chunk: the user turn names its
title). Plain prose in the assistant turn is what the draft will be asked to continue.

Held out of every example (`HeldOut`, checked again over the result by `check_held_out`):
  * the man pages of `HELD_OUT_PACKAGES` (coreutils, findutils, grep, sed, tar,
    util-linux, procps, gzip, diffutils): a page of that name from any package is
    dropped, and so is any paragraph sharing a sentence with one of their pages;
  * every page and paragraph of the two tasks' validation and test splits: their man
    pages by name, and any paragraph sharing a sentence with their sources.
Sentences are compared normalized (lower case, letters and digits, >= 6 words).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator

from specdec_jax import atomic_io
from specdec_jax.data import corpora, doc_text, layout

# Packages whose man pages are a held-out test set: no training corpus reads them.
HELD_OUT_PACKAGES = ("coreutils", "findutils", "grep", "sed", "tar", "util-linux", "procps",
                     "gzip", "diffutils")
# Binary packages built from the held-out sources (their man pages are the same pages).
_HELD_OUT_SIBLINGS = frozenset({"bsdutils", "bsdextrautils", "mount", "fdisk", "util-linux-extra",
                                "util-linux-locales", "uuid-runtime", "rfkill", "eject"})
# Packages whose man pages join the corpus (English pages under usr/share/man/man*).
MAN_PACKAGES = (
    "apt", "at", "bash", "bc", "bind9-dnsutils", "binutils-common", "bzip2", "cpio", "cron",
    "curl", "dc", "debianutils", "dpkg", "dpkg-dev", "e2fsprogs", "ed", "ethtool", "file",
    "gawk", "gdb", "git-man", "gnupg-utils", "gpg", "groff", "groff-base", "iproute2",
    "iptables", "iputils-ping", "kmod", "less", "lsof", "lvm2", "m4", "make", "man-db",
    "mdadm", "nano", "ncurses-bin", "net-tools", "nftables", "openssh-client",
    "openssh-server", "openssl", "parted", "patch", "perl", "postgresql-client-15", "psmisc",
    "rsync", "rsyslog", "screen", "sharutils", "sqlite3", "strace", "sudo", "systemd",
    "tcpdump", "time", "tmux", "unzip", "valgrind", "wget", "xz-utils", "zip", "zsh-common",
)


@dataclasses.dataclass(frozen=True)
class Source:
  """Documentation files of one package.

  Attributes:
    package: the Debian package.
    kind: "man", "rst", "html", "pod" or "wordnet" (`doc_text`'s readers).
    root: the files' directory inside the package ("rst", "html", "pod").
    suffixes: the files' name endings ("rst", "html", "pod").
    max_words: the most words taken from it (documents in sorted order), or None.
    group: examples are ordered by group first: the most in-domain text (0) is scored
      first, so a run stopped early holds it.
  """
  package: str
  kind: str
  root: str = ""
  suffixes: tuple[str, ...] = ()
  max_words: int | None = None
  group: int = 0


SOURCES = tuple(Source(p, "man") for p in MAN_PACKAGES) + (
    Source("python3.11-doc", "rst", "usr/share/doc/python3.11/html/_sources", (".rst.txt",),
           group=1),
    Source("postgresql-doc-15", "html", "usr/share/doc/postgresql-doc-15/html", (".html",),
           group=1),
    Source("perl-doc", "pod", "usr/share/perl", (".pod",), group=1),
    Source("bash-doc", "html", "usr/share/doc/bash", ("bashref.html",), group=1),
    Source("debian-reference-en", "html", "usr/share/debian-reference", (".en.html",), group=1),
    Source("wordnet-base", "wordnet", max_words=400_000, group=2),
    Source("linux-doc-6.1", "rst", "usr/share/doc/linux-doc-6.1/Documentation",
           (".rst.gz", ".txt.gz"), max_words=1_200_000, group=2),
)
# The LibreOffice help's training pages (the prepared En-De corpus's English side).
LIBREOFFICE = "libreoffice-help-en-us"
CHUNK_WORDS = 160
# WordNet synsets per document (one short gloss each).
_SYNSETS_PER_DOCUMENT = 40
_SENTENCE = re.compile(r"(?<=[.!?:;])\s+")
_NON_WORD = re.compile(r"[^a-z0-9]+")


class CorpusError(ValueError):
  """A package of the corpus is missing, or the corpus would hold held-out text."""


def packages() -> tuple[str, ...]:
  """Every package the corpus reads, held-out ones included (their pages are excluded)."""
  return tuple(s.package for s in SOURCES) + HELD_OUT_PACKAGES


def sentence_keys(text: str) -> set[str]:
  """The normalized sentences of `text` with >= 6 words (the held-out comparison's unit)."""
  keys = set()
  for sentence in _SENTENCE.split(text):
    words = _NON_WORD.sub(" ", sentence.lower()).split()
    if len(words) >= 6:
      keys.add(" ".join(words))
  return keys


def page_key(name: str) -> str:
  """A man page's name without its directory and compression: "man1/ls.1.gz" -> "ls.1"."""
  base = os.path.basename(name)
  return base[:-3] if base.endswith(".gz") else base


@dataclasses.dataclass
class HeldOut:
  """What no training example may hold.

  Attributes:
    pages: man page keys (`page_key`) that are held out.
    sentences: normalized sentences (`sentence_keys`) that are held out.
  """
  pages: set[str] = dataclasses.field(default_factory=set)
  sentences: set[str] = dataclasses.field(default_factory=set)

  def add_page(self, name: str, texts: Iterable[str]) -> None:
    self.pages.add(page_key(name))
    self.add_texts(texts)

  def add_texts(self, texts: Iterable[str]) -> None:
    for text in texts:
      self.sentences |= sentence_keys(text)

  def holds(self, text: str) -> bool:
    return not self.sentences.isdisjoint(sentence_keys(text))


def held_out_split_texts(data_dir: str) -> tuple[list[str], list[str], list[str]]:
  """The two tasks' validation and test splits: (man page names, man page sources,
  LibreOffice paragraphs), from the prepared corpora.

  Raises:
    FileNotFoundError: the corpora are not prepared (`python -m specdec_jax.data.prepare`).
  """
  names, pages, paragraphs = [], [], []
  for corpus, split in [(c, s) for c in ("mansum", "ende") for s in ("validation", "test")]:
    path = layout.corpus_file(data_dir, corpus, split)
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} is missing: prepare the corpora first (python -m "
                              "specdec_jax.data.prepare).")
    for ex in corpora.read_jsonl(path):
      if corpus == "mansum":
        names.append(ex.page)
        pages.append(ex.inputs)
      else:
        paragraphs.append(ex.inputs)
  return names, pages, paragraphs


def held_out(held_out_dirs: dict[str, str], data_dir: str) -> HeldOut:
  """The held-out packages' man pages and the tasks' validation and test splits.

  Args:
    held_out_dirs: {package: unpacked directory} of every package in `HELD_OUT_PACKAGES`.
    data_dir: the prepared data directory (its corpora's splits).
  """
  result = HeldOut()
  for package, directory in sorted(held_out_dirs.items()):
    for doc in doc_text.man_documents(directory, package):
      result.add_page(doc.name, doc.paragraphs + (doc.title,))
  names, pages, paragraphs = held_out_split_texts(data_dir)
  for name, text in zip(names, pages, strict=True):
    result.add_page(name, [text])
  result.add_texts(paragraphs)
  return result


def libreoffice_documents(data_dir: str) -> list[doc_text.Document]:
  """The En-De corpus's training pages, their English paragraphs in file order."""
  pages: dict[str, list[str]] = {}
  for ex in corpora.read_jsonl(layout.corpus_file(data_dir, "ende", "train")):
    if doc_text.is_prose(ex.inputs):
      pages.setdefault(ex.page, []).append(ex.inputs)
  return [doc_text.Document(LIBREOFFICE, page, page, tuple(paragraphs))
          for page, paragraphs in sorted(pages.items())]


def source_documents(source: Source, unpacked_dir: str) -> Iterator[doc_text.Document]:
  """A source's documents, at most `source.max_words` words of them."""
  if source.kind == "man":
    docs = doc_text.man_documents(unpacked_dir, source.package)
  elif source.kind == "wordnet":
    docs = _grouped(doc_text.wordnet_documents(unpacked_dir, source.package))
  else:
    docs = doc_text.file_documents(unpacked_dir, source.package, source.kind, source.root,
                                   source.suffixes)
  words = 0
  for doc in docs:
    if source.max_words is not None and words >= source.max_words:
      return
    words += sum(len(p.split()) for p in doc.paragraphs)
    yield doc


def _grouped(synsets: Iterator[doc_text.Document]) -> Iterator[doc_text.Document]:
  """WordNet synsets as documents of `_SYNSETS_PER_DOCUMENT` "words: gloss." lines."""
  batch: list[doc_text.Document] = []
  for doc in [*synsets, None]:
    if doc is not None:
      batch.append(doc)
    if batch and (doc is None or len(batch) == _SYNSETS_PER_DOCUMENT):
      lines = tuple(f"{d.title}: {d.paragraphs[0].rstrip('.;')}." for d in batch)
      yield doc_text.Document(batch[0].package, batch[0].name, "WordNet glosses", lines)
      batch = []


def filter_documents(docs: Iterable[doc_text.Document], holdout: HeldOut
                     ) -> tuple[list[doc_text.Document], dict[str, int]]:
  """Drops held-out pages, held-out paragraphs and paragraphs seen before.

  Returns:
    The kept documents (those with a paragraph left) and counts of what was dropped:
    {"pages", "paragraphs", "duplicates"}.
  """
  kept, dropped = [], {"pages": 0, "paragraphs": 0, "duplicates": 0}
  seen: set[str] = set()
  for doc in docs:
    if doc.name.startswith("man") and page_key(doc.name) in holdout.pages:
      dropped["pages"] += 1
      continue
    paragraphs = []
    for p in doc.paragraphs:
      key = hashlib.sha1(" ".join(p.split()).encode("utf-8")).hexdigest()
      if key in seen:
        dropped["duplicates"] += 1
      elif holdout.holds(p):
        dropped["paragraphs"] += 1
      else:
        seen.add(key)
        paragraphs.append(p)
    if paragraphs:
      kept.append(dataclasses.replace(doc, paragraphs=tuple(paragraphs)))
  return kept, dropped


@dataclasses.dataclass(frozen=True)
class TextExample:
  """One chat-shaped training example.

  Attributes:
    id: "<package>/<document name>#<i>".
    package: the source package.
    task: the instruction's task ("mansum" or "explain").
    passage: the user turn's text after the instruction.
    answer: the assistant turn.
    group: the source's group (`Source.group`).
  """
  id: str
  package: str
  task: str
  passage: str
  answer: str
  group: int


def chunks(paragraphs: Iterable[str], max_words: int = CHUNK_WORDS) -> list[str]:
  """Paragraphs packed in order into chunks of at most `max_words` words (a longer
  paragraph is cut at sentence ends, a longer sentence at `max_words` words)."""
  pieces = []
  for paragraph in paragraphs:
    for sentence in _SENTENCE.split(paragraph):
      words = sentence.split()
      pieces.extend(" ".join(words[i:i + max_words]) for i in range(0, len(words), max_words))
  out, current, count = [], [], 0
  for piece in pieces:
    n = len(piece.split())
    if current and count + n > max_words:
      out.append(" ".join(current))
      current, count = [], 0
    current.append(piece)
    count += n
  if current:
    out.append(" ".join(current))
  return out


def _task_of(example_id: str) -> str:
  """"mansum" or "explain", a fixed function of the id (half each)."""
  return ("mansum", "explain")[hashlib.sha256(example_id.encode("utf-8")).digest()[0] % 2]


def document_examples(doc: doc_text.Document, group: int) -> list[TextExample]:
  """Pairs of consecutive chunks (user passage, assistant answer); an unpaired last chunk
  is answered after its document's title."""
  parts = chunks(doc.paragraphs)
  examples = []
  for i in range(0, len(parts), 2):
    example_id = f"{doc.package}/{doc.name}#{i // 2}"
    passage, answer = (parts[i], parts[i + 1]) if i + 1 < len(parts) else (doc.title, parts[i])
    examples.append(TextExample(example_id, doc.package, _task_of(example_id), passage, answer,
                                group))
  return examples


def check_held_out(examples: Iterable[TextExample], holdout: HeldOut) -> int:
  """Refuses examples that hold a held-out sentence; returns how many were checked.

  Raises:
    CorpusError: naming the first example that holds one.
  """
  count = 0
  for ex in examples:
    for text in (ex.passage, ex.answer):
      if holdout.holds(text):
        raise CorpusError(f"example {ex.id} holds a held-out sentence: the filter "
                          "(text_corpus.filter_documents) let it through.")
    count += 1
  return count


def write_examples(path: str, examples: list[TextExample]) -> str:
  """Writes examples as JSONL atomically; returns the file's sha256."""
  text = "".join(json.dumps(dataclasses.asdict(ex), ensure_ascii=False) + "\n"
                 for ex in examples)
  atomic_io.atomic_write_bytes(path, text.encode("utf-8"))
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_examples(path: str) -> list[TextExample]:
  with open(path, encoding="utf-8") as f:
    return [TextExample(**json.loads(line)) for line in f if line.strip()]

