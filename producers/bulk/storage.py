"""Where a dataset's parts live: local disks or S3, through pyarrow's filesystems.

A location is a pyarrow ``FileSystem`` plus a path on it, so listing, reading
and publishing are written once for both. S3 settings come from the entry
point (:class:`S3Options`, read from ``AWS_*`` there), never from the
environment deep in here: pyarrow's ``S3FileSystem`` honours the AWS SDK's
credential chain (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...) but not
``AWS_ENDPOINT_URL``, so the endpoint is passed as ``endpoint_override``.

Publishing is what makes an output part appear *complete or not at all*:

* local: the part is written under a hidden staging name on the same disk,
  fsynced, and renamed over the final name;
* S3 has no rename, and an unclosed pyarrow output stream *completes* its
  multipart upload when it is garbage-collected (Arrow closes from the
  destructor), so a failing upload straight to the final key could leave a
  complete-looking partial object there. The part is therefore uploaded under
  a temporary key (``OUTPUT/_tmp/...``, which dataset readers skip as they skip
  every ``_``-prefixed name), copied server-side to its final key (CopyObject:
  the final object appears whole, at once), and the temporary key deleted. A
  killed upload leaves at most an incomplete multipart upload (invisible) or
  a temporary object, which the next publish of that part replaces.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from batchfleet.producers.bulk.errors import InputFormatError
from batchfleet.schemas.errors import ConfigError


def _pafs() -> Any:
    """pyarrow's filesystems, imported on first use: deciding whether an input is a
    dataset at all must not need the bulk extra (a JSONL file never does)."""
    import pyarrow.fs as pafs  # type: ignore[import-untyped,unused-ignore]

    return pafs

S3_SCHEME: Final = "s3://"
GLOB_CHARS: Final = frozenset("*?[")
#: Reads from S3 go through a buffer this big (one ranged GET per refill).
READ_BUFFER: Final = 8 << 20
_UPLOAD_CHUNK: Final = 8 << 20


@dataclass(frozen=True, slots=True)
class S3Options:
    """How to reach S3 (or an S3-compatible store): read once, at the entry point."""

    #: ``http(s)://host:port`` of an S3-compatible server; None: AWS itself.
    endpoint: str | None = None
    region: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], endpoint: str | None = None) -> S3Options:
        """``endpoint`` (``--s3-endpoint``) first, then ``AWS_ENDPOINT_URL_S3`` and
        ``AWS_ENDPOINT_URL`` (the AWS SDKs' names); region from ``AWS_REGION`` or
        ``AWS_DEFAULT_REGION``. Credentials stay with the AWS SDK's own chain."""
        endpoint = endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        return cls(endpoint or None, region or None)

    def filesystem(self) -> Any:
        kwargs: dict[str, Any] = {"connect_timeout": 10.0, "request_timeout": 60.0}
        if self.region:
            kwargs["region"] = self.region
        if self.endpoint:
            scheme, sep, rest = self.endpoint.partition("://")
            if not sep or scheme not in ("http", "https") or not rest.strip("/"):
                raise ConfigError(f"--s3-endpoint {self.endpoint!r} must be http(s)://host[:port]")
            kwargs.update(endpoint_override=rest.rstrip("/"), scheme=scheme)
        return _pafs().S3FileSystem(**kwargs)


def is_remote(url: str) -> bool:
    return url.startswith(S3_SCHEME)


def has_glob(text: str) -> bool:
    return any(c in GLOB_CHARS for c in text)


@dataclass(frozen=True, slots=True)
class Location:
    """A path on a filesystem, and how to name it to a person (``url``)."""

    fs: Any
    path: str
    url: str

    @property
    def remote(self) -> bool:
        return is_remote(self.url)

    def child(self, relative: str) -> Location:
        sep = "" if self.url.endswith("/") else "/"
        return Location(self.fs, f"{self.path.rstrip('/')}/{relative}",
                        f"{self.url}{sep}{relative}")


def locate(url: str, s3: S3Options) -> Location:
    """``s3://bucket/key`` or a local path as a :class:`Location` (nothing is read yet)."""
    if is_remote(url):
        path = url[len(S3_SCHEME):].strip("/")
        if not path:
            raise ConfigError(f"{url}: an S3 URL needs a bucket (s3://bucket/prefix)")
        return Location(s3.filesystem(), path, f"{S3_SCHEME}{path}")
    local = Path(url).expanduser().absolute()
    return Location(_pafs().LocalFileSystem(), local.as_posix(), str(local))


def _one_line(exc: BaseException) -> str:
    """pyarrow's S3 errors run to several lines with request IDs: keep what says why."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "NO_SUCH_BUCKET" in text:
        return "the bucket does not exist"
    return text.split(" (Request ID")[0]


def glob_match(relative: str, pattern: str) -> bool:
    """Shell-glob matching: ``*`` stays within one folder, ``**`` crosses folders."""
    if "**" in pattern:
        return fnmatch.fnmatchcase(relative, pattern)
    names, globs = relative.split("/"), pattern.split("/")
    return len(names) == len(globs) and all(
        fnmatch.fnmatchcase(n, g) for n, g in zip(names, globs, strict=True))


@dataclass(frozen=True, slots=True)
class FoundFile:
    #: Path relative to the listed root (``a/part-0.parquet``): the output part's name too.
    relative: str
    location: Location
    size: int
    mtime_ns: int


def list_files(root: Location, pattern: str | None = None) -> list[FoundFile]:
    """Every file under ``root`` (recursively, sorted), or those whose relative path
    matches ``pattern``. Hidden and ``_``-prefixed names (staging, ``_SUCCESS``,
    ``_errors``) are skipped, as dataset readers skip them."""
    try:
        infos = root.fs.get_file_info(_pafs().FileSelector(root.path, recursive=True,
                                                        allow_not_found=True))
    except (OSError, ValueError) as exc:
        raise InputFormatError(f"cannot list {root.url}: {_one_line(exc)}") from None
    if not infos and root.remote:
        bucket = root.path.split("/")[0]
        if stat(Location(root.fs, bucket, S3_SCHEME + bucket)).type == _pafs().FileType.NotFound:
            raise InputFormatError(f"cannot list {root.url}: bucket {bucket!r} does not exist")
    found = []
    base = root.path.rstrip("/") + "/"
    for info in infos:
        if info.type != _pafs().FileType.File or not info.path.startswith(base):
            continue
        relative = info.path[len(base):]
        if any(p.startswith((".", "_")) for p in relative.split("/")):
            continue
        if pattern is not None and not glob_match(relative, pattern):
            continue
        found.append(FoundFile(relative, root.child(relative), int(info.size or 0),
                               int(info.mtime_ns or 0)))
    return sorted(found, key=lambda f: f.relative)


def stat(location: Location) -> Any:
    """The location's ``FileInfo``; an unreachable store is an :class:`InputFormatError`."""
    try:
        return location.fs.get_file_info(location.path)
    except (OSError, ValueError) as exc:
        raise InputFormatError(f"cannot read {location.url}: {_one_line(exc)}") from None


def open_read(location: Location) -> IO[bytes]:
    """A seekable, buffered binary reader (so line reads do not cost a GET each)."""
    import io

    raw = location.fs.open_input_file(location.path)
    return io.BufferedReader(raw, READ_BUFFER)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(staged: Path, final: Location, tmp: Location) -> None:
    """Make the complete, fsynced local file ``staged`` appear at ``final``, whole.

    Local: rename (``staged`` is on the same disk). S3: upload to ``tmp``, copy
    to ``final`` server-side, delete ``tmp`` (see the module docstring).
    """
    if not final.remote:
        target = Path(final.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, target)
        _fsync_dir(target.parent)
        return
    try:
        with staged.open("rb") as src, final.fs.open_output_stream(tmp.path) as out:
            while chunk := src.read(_UPLOAD_CHUNK):
                out.write(chunk)
        final.fs.copy_file(tmp.path, final.path)
        final.fs.delete_file(tmp.path)
    except OSError as exc:
        raise OSError(f"cannot upload {final.url}: {_one_line(exc)}") from None


def remove(location: Location) -> None:
    """Delete one file if it is there (a stale errors file, a temporary upload)."""
    try:
        if location.fs.get_file_info(location.path).type == _pafs().FileType.File:
            location.fs.delete_file(location.path)
    except OSError as exc:
        raise OSError(f"cannot delete {location.url}: {_one_line(exc)}") from None


def exists(location: Location) -> bool:
    return bool(stat(location).type == _pafs().FileType.File)
