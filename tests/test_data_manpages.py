"""Tests of the roff parser and the man-page summarization pairs."""

import gzip
import os

from specdec_jax.data import manpages

_PAGE = r""".\" Copyright line
.TH hsearch 3 2022-12-15 "Linux man-pages 6.03"
.SH NAME
hcreate, hdestroy,
hsearch \- hash table management
.SH SYNOPSIS
.nf
.B #include <search.h>
.fi
.SH DESCRIPTION
The three functions
.BR hcreate (),
.BR hsearch (),
and
.BR hdestroy ()
allow the caller to manage a \fIhash\fP table.  \" trailing comment
.PP
The argument \fInel\fP is \(lqlarge\(rq \(em see
.IR malloc (3).
.EX
struct entry { char *key; };
.EE
.TS
l l.
a	b
.TE
.TP
.B ENOMEM
Out of memory \e0.
.SH RETURN VALUE
Zero.
"""


def test_unescape_fonts_dashes_and_named_characters():
  assert manpages.unescape(r"\fBbold\fP \- \(em \[u00E4] \*(lqq\*(rq a\&b \e") == (
      "bold - — ä “q” ab \\")


def test_roff_to_sections_strips_macros_examples_tables_and_comments():
  sections = manpages.roff_to_sections(_PAGE)
  assert list(sections) == ["NAME", "SYNOPSIS", "DESCRIPTION", "RETURN VALUE"]
  assert sections["DESCRIPTION"] == [
      "The three functions hcreate(), hsearch(), and hdestroy() allow the caller to manage a "
      "hash table.",
      "The argument nel is “large” — see malloc(3).",
      "ENOMEM Out of memory \\0.",
  ]


def test_page_pair_takes_text_after_the_dash():
  description, summary = manpages.page_pair(_PAGE)
  assert summary == "hash table management"
  assert description.startswith("The three functions hcreate()")
  assert manpages.page_pair(".SH NAME\nfoo \\- bar\n") is None  # No DESCRIPTION.


def test_iter_man_sources_skips_links_and_so_redirections(tmp_path):
  man3 = tmp_path / manpages.MAN_ROOT / "man3"
  os.makedirs(man3)
  with gzip.open(man3 / "hsearch.3.gz", "wt") as f:
    f.write(_PAGE)
  with gzip.open(man3 / "hcreate.3.gz", "wt") as f:
    f.write('.\\" comment\n.so man3/hsearch.3\n')
  os.symlink("hsearch.3.gz", man3 / "hdestroy.3.gz")
  examples = manpages.build_examples([str(tmp_path)])
  assert [(ex.id, ex.page, ex.targets) for ex in examples] == [
      ("man3/hsearch.3", "man3/hsearch.3", "hash table management")]
