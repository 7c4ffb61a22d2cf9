"""Fetch Debian packages with `apt-get download` and unpack them with `dpkg-deb -x`.

Nothing is installed: the packages are only read as archives.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import subprocess
import tempfile

PACKAGES = ("libreoffice-help-en-us", "libreoffice-help-de", "manpages", "manpages-dev")


class PackageError(RuntimeError):
  """A package could not be fetched, identified or unpacked."""


@dataclasses.dataclass(frozen=True)
class Deb:
  """One .deb file and what its control file says."""
  package: str
  version: str
  path: str


def _by_hand_hint(deb_dir: str) -> str:
  return (f"or fetch the .deb files of {', '.join(PACKAGES)} by hand (any Debian/Ubuntu "
          f"mirror) and pass their directory with --deb_dir (now: {deb_dir!r}).")


def _require(tool: str, deb_dir: str) -> str:
  path = shutil.which(tool)
  if path is None:
    raise PackageError(f"`{tool}` is not available on this machine: install it, "
                       + _by_hand_hint(deb_dir))
  return path


def read_control(path: str) -> Deb:
  """Package name and version of a .deb file (`dpkg-deb -f`)."""
  dpkg_deb = _require("dpkg-deb", os.path.dirname(path))
  out = subprocess.run([dpkg_deb, "-f", path, "Package", "Version"], check=True,
                       capture_output=True, text=True).stdout
  fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
  return Deb(package=fields["Package"], version=fields["Version"], path=path)


def find_debs(deb_dir: str, packages: tuple[str, ...] = PACKAGES) -> dict[str, Deb]:
  """The .deb file of each wanted package found in `deb_dir` (missing ones are absent).

  Raises:
    PackageError: if a package has more than one .deb file in `deb_dir`.
  """
  found: dict[str, Deb] = {}
  for path in sorted(glob.glob(os.path.join(deb_dir, "*.deb"))):
    deb = read_control(path)
    if deb.package not in packages:
      continue
    if deb.package in found:
      raise PackageError(
          f"deb_dir={deb_dir!r} holds two .deb files of {deb.package} "
          f"({os.path.basename(found[deb.package].path)}, {os.path.basename(path)}): "
          "keep only one so that the corpora are reproducible.")
    found[deb.package] = deb
  return found


def download(packages: tuple[str, ...], deb_dir: str) -> None:
  """Runs `apt-get download` for `packages` inside `deb_dir`.

  Raises:
    PackageError: if apt-get is missing or fails, saying what to do instead.
  """
  apt_get = _require("apt-get", deb_dir)
  os.makedirs(deb_dir, exist_ok=True)
  result = subprocess.run([apt_get, "download", *packages], cwd=deb_dir,
                          capture_output=True, text=True)
  if result.returncode != 0:
    raise PackageError(
        f"`apt-get download {' '.join(packages)}` failed ({result.stderr.strip()[-400:]}). "
        "If the package lists are empty or stale, run `apt-get update` (as root) and retry, "
        + _by_hand_hint(deb_dir))


def unpack(deb: Deb, dest: str) -> str:
  """Unpacks `deb` into `dest` (once: an existing `dest` is reused); returns `dest`."""
  if os.path.isdir(dest):
    return dest
  dpkg_deb = _require("dpkg-deb", os.path.dirname(deb.path))
  parent = os.path.dirname(dest)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp_unpack_")
  try:
    subprocess.run([dpkg_deb, "-x", deb.path, tmp], check=True, capture_output=True)
    os.replace(tmp, dest)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return dest
