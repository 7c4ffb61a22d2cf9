"""Tests of the LibreOffice help parser, cleaner and aligner on synthetic pages."""

import os

from specdec_jax.data import libreoffice

_SWITCH = (
    'Press <span id="swlnsys_1" class="switchinline">'
    '<span hidden="true" id="MACtext_1" class="MAC"><span class="keycode">Command</span></span>'
    '<span hidden="true" id="defaulttext_1"><span class="keycode">Ctrl</span></span></span>'
    '<span class="keycode"> + F</span>.')


def _page(body: str) -> str:
  return f'<html><head><meta charset="utf-8"><title>T</title></head><body>{body}</body></html>'


def test_platform_switch_keeps_default_variant():
  html = _page(f'<p id="par_id1" class="paragraph">{_SWITCH}</p>')
  (para,) = libreoffice.parse_help_page(html, "text/swriter/a.html")
  assert para.text == "Press Ctrl + F."
  assert "Command" not in para.text


def test_application_switch_without_default_is_dropped():
  html = _page(
      '<p id="par_id2">Sorts data.<span id="swlnappl_1" class="switchinline">'
      '<span hidden="true" id="CALCx_1" class="CALC"> Also in Calc.</span></span></p>')
  (para,) = libreoffice.parse_help_page(html, "p.html")
  assert para.text == "Sorts data."


def test_markup_links_images_and_entities_are_cleaned():
  html = _page(
      '<h2 id="hd_id3">Find <a href="x.html">Next</a></h2>'
      '<p id="par_id4"><img src="i.svg" alt="Icon">Choose <span class="menuitem">Tools -'
      '\n   Options</span> &amp; <br>more</p>'
      '<p class="noid">not aligned</p>')
  paras = libreoffice.parse_help_page(html, "p.html")
  assert [(p.key, p.text) for p in paras] == [
      ("hd_id3#0", "Find Next"), ("par_id4#0", "Choose Tools - Options & more")]


def test_block_switch_keeps_paragraphs_inside_variants_and_numbers_repeats():
  html = _page(
      '<span id="swlnappl_2" class="switch"><span hidden="true" id="CALC_2" class="CALC">'
      '<p id="par_id5">Calc text.</p></span>'
      '<span hidden="true" id="WRITER_2" class="WRITER"><p id="par_id5">Writer text.</p>'
      '</span></span>')
  paras = libreoffice.parse_help_page(html, "p.html")
  assert [(p.key, p.text) for p in paras] == [
      ("par_id5#0", "Calc text."), ("par_id5#1", "Writer text.")]


def test_align_pages_filters_empty_numeric_and_identical():
  en = {"text/a/x.html": {"p#0": "Hello", "q#0": "42", "r#0": "Basis", "s#0": "Only en"}}
  de = {"text/a/x.html": {"p#0": "Hallo", "q#0": "42", "r#0": "Basis", "s#0": ""}}
  assert list(libreoffice.align_pages(en, de)) == [("text/a/x.html", "p#0", "Hello", "Hallo")]


def test_build_examples_aligns_two_unpacked_trees(tmp_path):
  pages = {
      "en": _page(f'<p id="par_id1">{_SWITCH}</p><p id="par_id9">Extra.</p>'),
      "de": _page(f'<p id="par_id1">{_SWITCH.replace("Press", "Drücken Sie")}</p>'),
  }
  dirs = {}
  for lang, html in pages.items():
    dirs[lang] = str(tmp_path / lang)
    page_dir = os.path.join(dirs[lang], libreoffice.HELP_ROOTS[lang], "text", "scalc", "01")
    os.makedirs(page_dir)
    with open(os.path.join(page_dir, "f.html"), "w", encoding="utf-8") as f:
      f.write(html)
  (ex,) = libreoffice.build_examples(dirs["en"], dirs["de"])
  assert ex.page == "text/scalc/01/f.html"
  assert ex.id == "text/scalc/01/f.html#par_id1#0"
  assert (ex.inputs, ex.targets) == ("Press Ctrl + F.", "Drücken Sie Ctrl + F.")
