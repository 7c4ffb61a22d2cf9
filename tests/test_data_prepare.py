"""End-to-end test of `prepare` on hand-built .deb packages (no network)."""

import gzip
import os
import pathlib
import subprocess

import pytest

from specdec_jax.data import corpora, debian, layout, libreoffice, manpages, prepare, prompts, vocab

_HELP = ('<html><body><h1 id="hd_id1">{title}</h1><p id="par_id2">{body} '
         '<span id="s_1" class="switchinline"><span hidden="true" id="MACa_1" class="MAC">'
         '{mac}</span><span hidden="true" id="defaulta_1">{default}</span></span></p>'
         '</body></html>')
_TEXT = {
    "en": {"title": "Page {i}", "body": "Press key {i} with", "mac": "Command",
           "default": "Ctrl"},
    "de": {"title": "Seite {i}", "body": "Drücken Sie Taste {i} mit", "mac": "Befehl",
           "default": "Strg"},
}
_MAN = '.TH X 3\n.SH NAME\nfn{i} \\- do thing {i}\n.SH DESCRIPTION\n.BR fn{i} ()\ndoes {i}.\n'


def _build_deb(tmp_path, package: str, files: dict[str, bytes]) -> None:
  root = tmp_path / "src" / package
  for rel, data in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
  (root / "DEBIAN").mkdir(parents=True)
  (root / "DEBIAN" / "control").write_text(
      f"Package: {package}\nVersion: 1.0-1\nArchitecture: all\nMaintainer: t <t@t>\n"
      "Description: test\n")
  out = tmp_path / "debs" / f"{package}_1.0-1_all.deb"
  out.parent.mkdir(exist_ok=True)
  subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-b", str(root), str(out)],
                 check=True, capture_output=True)


@pytest.fixture(scope="module")
def deb_dir(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("debs")
  for lang, package in (("en", "libreoffice-help-en-us"), ("de", "libreoffice-help-de")):
    files = {}
    for i in range(30):
      text = {k: v.format(i=i) for k, v in _TEXT[lang].items()}
      files[f"{libreoffice.HELP_ROOTS[lang]}/text/m{i % 3}/p{i}.html"] = _HELP.format(
          **text).encode()
    _build_deb(tmp, package, files)
  for package, offset in (("manpages", 0), ("manpages-dev", 100)):
    files = {f"{manpages.MAN_ROOT}/man3/fn{i}.3.gz": gzip.compress(
        _MAN.format(i=i).encode(), mtime=0) for i in range(offset, offset + 20)}
    _build_deb(tmp, package, files)
  return str(tmp / "debs")


def test_prepare_is_deterministic_cached_and_disjoint(tmp_path, deb_dir):
  outputs = []
  for run in ("a", "b"):
    data_dir = str(tmp_path / run)
    manifest = prepare.prepare(data_dir, deb_dir, train_vocab=False)
    assert prepare.is_prepared(data_dir)
    outputs.append({rel: pathlib.Path(data_dir, rel).read_bytes()
                    for rel in [*manifest["files"], layout.MANIFEST]})
  assert outputs[0] == outputs[1]
  rows = {c: {s: v["rows"] for s, v in by.items()} for c, by in manifest["corpora"].items()}
  assert sum(rows["ende"].values()) == 60  # 30 pages x (heading + paragraph).
  assert sum(rows["mansum"].values()) == 40
  assert manifest["debs"]["manpages"]["version"] == "1.0-1"
  pairs = prepare.corpora.read_text_pairs("ende", "train", data_dir=str(tmp_path / "a"))
  assert any(t.endswith("mit Strg") for _, t in pairs)
  assert not any("Befehl" in t or "Command" in i for i, t in pairs)


def test_is_prepared_false_when_an_output_is_missing(tmp_path, deb_dir):
  data_dir = str(tmp_path)
  manifest = prepare.prepare(data_dir, deb_dir, train_vocab=False)
  os.remove(os.path.join(data_dir, manifest["files"][0]))
  assert not prepare.is_prepared(data_dir)


def test_export_assets_writes_the_statistics_and_the_committed_prompts(tmp_path, deb_dir,
                                                                       monkeypatch):
  data_dir = str(tmp_path / "data")
  prepare.prepare(data_dir, deb_dir, train_vocab=False)
  assets = tmp_path / "assets"
  monkeypatch.setattr(layout, "ASSETS_DIR", str(assets))
  monkeypatch.setattr(prompts, "PROMPTS_DIR", str(assets / "prompts"))
  done = prepare.export_assets(data_dir)
  for name in ("ende", "mansum"):
    assert (pathlib.Path(layout.stats_file(str(assets / "stats"), name)).read_bytes()
            == pathlib.Path(layout.stats_file(os.path.join(data_dir, "stats"), name)).read_bytes())
  test = corpora.read_jsonl(layout.corpus_file(data_dir, "ende", prompts.PROMPTS_SPLIT))
  monkeypatch.setenv(layout.DATA_DIR_ENV, str(tmp_path / "none"))  # Read the file written.
  committed = prompts.load_examples("ende", prompts.PROMPTS_SPLIT, None)
  assert committed[1] == prompts.prompts_file("ende")
  assert [t for _, t in committed[0]] == [ex.targets for ex in test[:len(committed[0])]]
  assert not any("vocab" in line for line in done)  # This preparation trained none.


def test_missing_deb_in_given_dir_is_named(tmp_path):
  with pytest.raises(debian.PackageError, match="lacks .deb files of libreoffice-help-en-us"):
    prepare.fetch_debs(str(tmp_path), str(tmp_path))


def test_without_apt_get_the_error_says_to_fetch_by_hand(tmp_path, monkeypatch):
  monkeypatch.setattr(debian.shutil, "which", lambda tool: None)
  with pytest.raises(debian.PackageError, match="apt-get` is not available.*--deb_dir"):
    prepare.fetch_debs(str(tmp_path), None)


def test_train_vocabulary_is_byte_identical(tmp_path):
  texts = [f"Drücken Sie die Taste {i} für Größe und Übersicht." for i in range(200)]
  texts += [f"Press key {i} to change the size of the overview." for i in range(200)]
  a = vocab.train_vocabulary(texts, str(tmp_path / "a"), vocab_size=60)
  b = vocab.train_vocabulary(texts, str(tmp_path / "b"), vocab_size=60)
  assert pathlib.Path(a).read_bytes() == pathlib.Path(b).read_bytes()
  assert vocab.load_processor(a).decode(vocab.load_processor(a).encode(texts[0])) == texts[0]
