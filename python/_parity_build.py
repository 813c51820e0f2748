"""The PEP 517 build backend of the `parity` package, in the tree and on the standard library
alone, so that building and installing it needs no network (pyproject.toml: requires = []).

Hooks: build_wheel (a py3-none-any wheel of parity/**/*.py with its .dist-info: METADATA, WHEEL,
RECORD), build_sdist (a .tar.gz of this directory's sources with PKG-INFO), build_editable (a
wheel holding a .pth file that puts this directory on sys.path), prepare_metadata_for_build_*,
and get_requires_for_build_* (nothing). The metadata come from pyproject.toml's [project].
Archives are reproducible: fixed timestamps, sorted entries.
"""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _project():
    """The [project] table of pyproject.toml (only string values are used)."""
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        raw = f.read()
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the flat `key = "string"` lines of [project]
        project, section = {}, None
        for line in raw.decode("utf-8").splitlines():
            m = re.match(r"\s*\[([^\]]+)\]\s*$", line)
            if m:
                section = m.group(1).strip()
                continue
            m = re.match(r'\s*([A-Za-z0-9_-]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(#.*)?$', line)
            if section == "project" and m:
                project[m.group(1)] = m.group(2).encode().decode("unicode_escape")
        return project
    return tomllib.loads(raw.decode("utf-8"))["project"]


def _names():
    p = _project()
    name, version = p["name"], p["version"]
    return p, name, version, re.sub(r"[-_.]+", "_", name).lower()


def _metadata():
    p, name, version, _ = _names()
    lines = ["Metadata-Version: 2.1", "Name: %s" % name, "Version: %s" % version]
    if "description" in p:
        lines.append("Summary: %s" % p["description"])
    if "requires-python" in p:
        lines.append("Requires-Python: %s" % p["requires-python"])
    if isinstance(p.get("license"), str):
        lines.append("License: %s" % p["license"])
    body = ""
    if isinstance(p.get("readme"), str):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(HERE, p["readme"]), encoding="utf-8") as f:
            body = f.read()
    return ("\n".join(lines) + "\n\n" + body).encode("utf-8")


def _wheel_file():
    return b"Wheel-Version: 1.0\nGenerator: _parity_build\nRoot-Is-Purelib: true\n" \
        b"Tag: py3-none-any\n"


def _package_files():
    """(path in the archive, path on disk) of every module of the package."""
    out = []
    for root, dirs, files in os.walk(os.path.join(HERE, "parity")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                disk = os.path.join(root, f)
                out.append((os.path.relpath(disk, HERE).replace(os.sep, "/"), disk))
    return out


def _write_wheel(wheel_directory, members):
    """Writes a wheel of `members` [(archive path, bytes)] plus its dist-info; returns its
    file name."""
    _, _, version, dist = _names()
    info = "%s-%s.dist-info" % (dist, version)
    members = list(members) + [(info + "/METADATA", _metadata()),
                               (info + "/WHEEL", _wheel_file())]
    record = []
    for path, data in members:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append("%s/RECORD,," % info)
    members.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
    filename = "%s-%s-py3-none-any.whl" % (dist, version)
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for path, data in members:
            zi = zipfile.ZipInfo(path, _EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return filename


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _, _, version, dist = _names()
    info = "%s-%s.dist-info" % (dist, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    for name, data in (("METADATA", _metadata()), ("WHEEL", _wheel_file())):
        with open(os.path.join(metadata_directory, info, name), "wb") as f:
            f.write(data)
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(a, _read(d)) for a, d in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _, _, _, dist = _names()
    return _write_wheel(wheel_directory, [("%s.pth" % dist, (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p, _, version, dist = _names()
    base = "%s-%s" % (dist, version)
    files = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
             ("_parity_build.py", os.path.join(HERE, "_parity_build.py"))]
    if isinstance(p.get("readme"), str):
        files.append((p["readme"], os.path.join(HERE, p["readme"])))
    files += _package_files()
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) \
            as tar:
        for arc, data in [("PKG-INFO", _metadata())] + [(a, _read(d)) for a, d in files]:
            ti = tarfile.TarInfo("%s/%s" % (base, arc))
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 315532800
            tar.addfile(ti, io.BytesIO(data))
    return filename
