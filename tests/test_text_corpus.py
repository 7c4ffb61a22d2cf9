"""Tests of the in-domain text corpus: its readers, and that held-out text stays out."""

import gzip
import os

import pytest

from specdec_jax.data import corpora, doc_text, layout, text_corpus

_HELD = ("The ls command lists information about the files in the current directory by "
         "default.")
_SPLIT = ("Choose Format then Character to change the font of the selected text in the "
          "document.")


def _man_page(name: str, summary: str, paragraphs: list[str]) -> str:
  body = "\n.PP\n".join(paragraphs)
  return (f".TH {name.upper()} 1\n.SH NAME\n{name} \\- {summary}\n.SH SYNOPSIS\n.B {name}\n"
          f".SH DESCRIPTION\n{body}\n")


def _write_page(root: str, name: str, source: str) -> None:
  directory = os.path.join(root, "usr/share/man/man1")
  os.makedirs(directory, exist_ok=True)
  with gzip.open(os.path.join(directory, f"{name}.1.gz"), "wt") as f:
    f.write(source)


def _prepared(data_dir: str) -> None:
  """Corpora whose validation/test splits hold one page and one paragraph."""
  for corpus in ("mansum", "ende"):
    for split in layout.SPLITS:
      if corpus == "mansum" and split == "test":
        examples = [corpora.Example("m0", "The frobnicate tool turns every widget on the "
                                    "system into a gadget of the same colour.", "t",
                                    "man1/frobnicate.1")]
      elif corpus == "ende" and split == "validation":
        examples = [corpora.Example("e0", _SPLIT, "t", "text/format.xhp")]
      else:
        examples = []
      path = layout.corpus_file(data_dir, corpus, split)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      corpora.write_jsonl(path, examples)


@pytest.fixture
def holdout(tmp_path):
  coreutils = tmp_path / "coreutils"
  _write_page(str(coreutils), "ls", _man_page("ls", "list directory contents", [_HELD]))
  data_dir = tmp_path / "data"
  _prepared(str(data_dir))
  return text_corpus.held_out({"coreutils": str(coreutils)}, str(data_dir))


def test_held_out_holds_the_packages_pages_and_the_splits(holdout):
  assert {"ls.1", "frobnicate.1"} <= holdout.pages
  assert holdout.holds(_HELD.upper())  # Compared normalized.
  assert holdout.holds(f"Some other words first. {_SPLIT}")
  assert not holdout.holds("A sentence that nobody held out of the training corpus at all.")


def test_filter_drops_held_out_pages_paragraphs_and_duplicates(holdout):
  fresh = "The make utility decides which pieces of a large program need to be recompiled."
  docs = [
      doc_text.Document("busybox", "man1/ls.1", "ls", (fresh + " Again.",)),  # A held page.
      doc_text.Document("make", "man1/make.1", "make", (fresh, f"Note well. {_HELD}")),
      doc_text.Document("libreoffice-help-en-us", "text/a.xhp", "a", (_SPLIT, fresh)),
  ]
  kept, dropped = text_corpus.filter_documents(docs, holdout)
  assert dropped == {"pages": 1, "paragraphs": 2, "duplicates": 1}
  assert [(d.name, d.paragraphs) for d in kept] == [("man1/make.1", (fresh,))]
  examples = [ex for d in kept for ex in text_corpus.document_examples(d, 0)]
  assert text_corpus.check_held_out(examples, holdout) == 1


def test_check_held_out_refuses_what_the_filter_would_have_dropped(holdout):
  """The negative control: examples built without the filter are refused."""
  doc = doc_text.Document("make", "man1/make.1", "make", (f"Note well. {_HELD}",))
  with pytest.raises(text_corpus.CorpusError, match="make/man1/make.1#0"):
    text_corpus.check_held_out(text_corpus.document_examples(doc, 0), holdout)


def test_held_out_needs_prepared_corpora(tmp_path):
  with pytest.raises(FileNotFoundError, match="specdec_jax.data.prepare"):
    text_corpus.held_out({}, str(tmp_path))


def test_man_documents_skip_name_and_synopsis(tmp_path):
  text = "The widget program arranges the widgets of a system in a pleasing order."
  _write_page(str(tmp_path), "widget", _man_page("widget", "arrange widgets", [text]))
  [doc] = doc_text.man_documents(str(tmp_path), "widgets")
  assert (doc.name, doc.title, doc.paragraphs) == ("man1/widget.1", "arrange widgets", (text,))


def test_chunks_pairs_and_tasks():
  sentences = [f"Sentence number {i} has exactly seven words." for i in range(100)]
  parts = text_corpus.chunks(sentences, max_words=21)
  assert all(len(p.split()) <= 21 for p in parts) and len(parts) == 34
  assert " ".join(parts) == " ".join(sentences)
  doc = doc_text.Document("pkg", "doc", "Title", tuple(sentences[:9]))
  examples = text_corpus.document_examples(doc, 2)
  [ex] = examples  # One chunk: answered after the title.
  assert (ex.passage, ex.answer, ex.group) == ("Title", " ".join(sentences[:9]), 2)
  long_doc = doc_text.Document("pkg", "long", "Title", tuple(sentences[:50]))
  first, second = text_corpus.document_examples(long_doc, 0)
  assert (first.passage, first.answer) == tuple(text_corpus.chunks(sentences[:50])[:2])
  assert second.passage == "Title" and first.id == "pkg/long#0"
  tasks = {text_corpus.document_examples(
      doc_text.Document("p", f"d{i}", "T", ("one two three",)), 0)[0].task for i in range(20)}
  assert tasks == {"mansum", "explain"}


def test_rst_html_and_pod_readers_keep_prose_only():
  rst = ("Title\n=====\n\n.. note:: skip me\n\nThe :func:`open` call returns a ``file`` "
         "object for reading.\n\nExample::\n\n    x = open('f')\n\nAfter it.\n")
  title, paragraphs = doc_text.rst_paragraphs(rst)
  assert title == "Title"
  assert "The open call returns a file object for reading." in paragraphs
  assert not any("x = open" in p or "skip me" in p for p in paragraphs)
  page = ("<html><title>T</title><p>The server keeps <b>every</b> table of the catalog in "
          "memory.</p><pre>the code of the example that nobody should read as prose</pre>"
          "<li>An item of a list that holds enough words to be prose.</li><p>Too short.</p>"
          "</html>")
  title, paragraphs = doc_text.html_paragraphs(page)
  assert (title, paragraphs) == ("T", [
      "The server keeps every table of the catalog in memory.",
      "An item of a list that holds enough words to be prose."])
  pod = ("=head1 NAME\n\nperlfoo - things\n\n=head1 DESCRIPTION\n\n"
         "Use C<print> and L<the docs|perlfunc> to write the words of a line.\n")
  _, paragraphs = doc_text.pod_paragraphs(pod)
  assert paragraphs == ["Use print and the docs to write the words of a line."]
  assert doc_text.is_prose("This is a plain sentence of running English prose here.")
  assert not doc_text.is_prose("x = f(a[i]) ; y = g(b[j]) ; z = {k: v} ; return x + y")


def test_write_and_read_examples_round_trip(tmp_path):
  ex = text_corpus.TextExample("p/d#0", "p", "mansum", "passage", "answer", 1)
  path = str(tmp_path / "examples.jsonl")
  assert len(text_corpus.write_examples(path, [ex, ex])) == 64
  assert text_corpus.read_examples(path) == [ex, ex]
