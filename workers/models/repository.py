"""A model repository (``--model-repository DIR|s3://bucket/prefix``; docs/models.md,
"Model repository"): one folder per model, one subfolder per version, a ``model.toml``.

::

    repo/
      textclf/
        model.toml          weights = "model.pt", input_spec = "int64[32]", cache_ttl_s = 60, ...
        1/  model.pt  READY
        2/  model.pt  READY
        3/  model.pt        <- being written: no READY yet, never loaded

**A version folder is complete when it holds a file named ``READY``**, which the
publisher writes last (on S3, where nothing is renamed atomically, the object written
last). A folder without it is being written and is never loaded; a folder whose name
starts with ``.`` or ``_`` is ignored. The served version is the highest complete one
(numerically where names are numbers).

``model.toml`` says where the weights are (``weights``: a TorchScript, ``torch.export``
or ONNX file in each version folder) or which code builds the model (``handler``: a
``module:factory`` imported as on ``--model``, or a built-in such as ``demo-mlp``), may
name a ``warmup_sample`` (one request's inputs, ``numpy.save``d in each version folder),
and may set any per-model setting of the worker by its name (``input_spec``,
``latency_slo_ms``, ``cache_ttl_s``, ``runtime``, ...; :func:`setting_keys`). A
command-line entry for the model (``--cache-ttl-s textclf=0``) wins over the file; the
file wins over a flag given for every model.

Reading is pure except :class:`Repository`'s two methods, which list and fetch files
through the local file system or pyarrow's (for ``s3://``, as bulk datasets do).
"""

from __future__ import annotations

import tempfile
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from batchfleet.schemas.errors import ConfigError
from batchfleet.schemas.per_model import ModelKey, PerModel
from batchfleet.schemas.registry import DEFAULT_LABEL
from batchfleet.schemas.settings import setting_options
from batchfleet.workers.models.handler import ModelHandler
from batchfleet.workers.models.lazy import ResidentHandler
from batchfleet.workers.models.loading import load_model, load_versions
from batchfleet.workers.settings import WorkerSettings

#: The file a version folder holds once it is complete.
READY = "READY"
MODEL_TOML = "model.toml"
#: Keys of ``model.toml`` that are not per-model settings.
SOURCE_KEYS = ("weights", "handler", "warmup_sample")


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model of a repository as last read."""

    name: str
    #: ``model.toml``'s table.
    config: Mapping[str, Any]
    #: Complete version folders, oldest first.
    versions: tuple[str, ...] = ()

    @property
    def latest(self) -> str | None:
        return self.versions[-1] if self.versions else None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a scan found: models by name."""

    models: Mapping[str, ModelEntry] = field(default_factory=dict)


def version_order(name: str) -> tuple[int, int, str]:
    """Numbers in numeric order, before other names in lexical order."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def complete_versions(entries: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Version folders (name -> the files they hold) that hold ``READY``, oldest first;
    hidden (``.``) and private (``_``) folders left out."""
    done = [v for v, files in entries.items()
            if not v.startswith((".", "_")) and READY in files]
    return tuple(sorted(done, key=version_order))


def parse_model_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from exc


def source_of(entry: ModelEntry, version_dir: str) -> str:
    """The ``--model`` source one version loads from: its weights file, or the handler."""
    weights, handler = entry.config.get("weights"), entry.config.get("handler")
    if bool(weights) == bool(handler):
        raise ConfigError(f"model {entry.name!r} ({MODEL_TOML}): give exactly one of "
                          "weights = \"FILE\" (in each version folder) or handler = "
                          "\"module:factory\"")
    return f"{version_dir}/{weights}" if weights else str(handler)


class Repository:
    """A repository at a local path or an ``s3://`` URL (through ``pyarrow.fs``)."""

    def __init__(self, url: str, cache_dir: str | None = None) -> None:
        self.url = url
        self._s3 = url.startswith("s3://")
        self._cache = Path(cache_dir or tempfile.mkdtemp(prefix="batchfleet-repo-"))
        if self._s3:
            try:
                from pyarrow import fs
            except ImportError:  # pragma: no cover - the bulk extra brings it
                raise ConfigError("an s3:// model repository needs pyarrow: "
                                  "pip install 'batchfleet[bulk]'") from None
            self._fs, self._root = fs.FileSystem.from_uri(url)
        else:
            if not Path(url).is_dir():
                raise ConfigError(f"--model-repository {url}: no such directory")
            self._root = str(Path(url).resolve())

    def scan(self) -> Snapshot:
        """Every model folder with a ``model.toml`` and its complete versions."""
        tree = self._listing()
        models: dict[str, ModelEntry] = {}
        for name, folders in sorted(tree.items()):
            files = folders.get("", [])
            if MODEL_TOML not in files or name.startswith((".", "_")):
                continue
            where = f"{self.url}/{name}/{MODEL_TOML}"
            config = parse_model_toml(self._read(f"{name}/{MODEL_TOML}"), where)
            versions = complete_versions({k: v for k, v in folders.items() if k})
            models[name] = ModelEntry(name, config, versions)
        return Snapshot(models)

    def local_version(self, model: str, version: str) -> str:
        """A local folder with the version's files (the folder itself, for a local
        repository; a copy in the cache, for S3)."""
        if not self._s3:
            return f"{self._root}/{model}/{version}"
        from pyarrow import fs

        target = self._cache / model / version
        if not (target / READY).exists():
            target.mkdir(parents=True, exist_ok=True)
            fs.copy_files(f"{self._root}/{model}/{version}", str(target),
                          source_filesystem=self._fs,
                          destination_filesystem=fs.LocalFileSystem())
        return str(target)

    def _listing(self) -> dict[str, dict[str, list[str]]]:
        """model -> version folder ("" for the model folder itself) -> file names."""
        tree: dict[str, dict[str, list[str]]] = {}
        if not self._s3:
            root = Path(self._root)
            for model in (p for p in root.iterdir() if p.is_dir()):
                folders = tree.setdefault(model.name, {"": []})
                for child in model.iterdir():
                    if child.is_file():
                        folders[""].append(child.name)
                    elif child.is_dir():
                        folders[child.name] = [f.name for f in child.iterdir() if f.is_file()]
            return tree
        from pyarrow import fs

        selector = fs.FileSelector(self._root, recursive=True, allow_not_found=True)
        for info in self._fs.get_file_info(selector):
            if info.type != fs.FileType.File:
                continue
            parts = info.path[len(self._root):].strip("/").split("/")
            if len(parts) == 2:
                tree.setdefault(parts[0], {"": []}).setdefault("", []).append(parts[1])
            elif len(parts) == 3:
                tree.setdefault(parts[0], {"": []}).setdefault(parts[1], []).append(parts[2])
        return tree

    def _read(self, relative: str) -> str:
        if not self._s3:
            return Path(self._root, relative).read_text()
        with self._fs.open_input_stream(f"{self._root}/{relative}") as stream:
            return bytes(stream.read()).decode()


def setting_keys(per_model_fields: Sequence[str]) -> dict[str, str]:
    """``model.toml`` key -> per-model setting field: the field's name, or its flag without
    dashes (``cache_ttl_s`` and ``cache-ttl-s`` both)."""
    return {**{f.replace("_", "-"): f for f in per_model_fields},
            **{f: f for f in per_model_fields}}


def settings_of(entry: ModelEntry, keys: Mapping[str, str]) -> dict[str, str]:
    """The per-model settings ``model.toml`` sets (field -> its value as on the command
    line); an unknown key is refused, naming the known ones."""
    out: dict[str, str] = {}
    for key, value in entry.config.items():
        if key in SOURCE_KEYS:
            continue
        if key not in keys:
            known = ", ".join(sorted(set(keys.values()) | set(SOURCE_KEYS)))
            raise ConfigError(f"model {entry.name!r} ({MODEL_TOML}): unknown key {key!r}; "
                              f"known: {known}")
        out[keys[key]] = _as_flag_value(value)
    return out


def _as_flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


#: A ``--model`` source that says "this model comes from the repository".
FROM_REPOSITORY = "@repository"


def from_repository(spec: str) -> bool:
    return spec.partition("=")[2].strip() == FROM_REPOSITORY


def with_repository(settings: WorkerSettings, snapshot: Snapshot,
                    only_repository: bool) -> WorkerSettings:
    """``settings`` serving the repository's models too (each as ``NAME=@repository``;
    ``only_repository``: instead of ``--model``'s default), with each ``model.toml``'s
    per-model settings under the command line's own entries for the model. A model with
    no complete version yet is left out (it is served from the next start)."""
    options = [o for o in setting_options(WorkerSettings) if o.opt.per_model]
    keys = setting_keys([o.name for o in options])
    served = [m for m, e in snapshot.models.items() if e.latest is not None]
    given = () if only_repository else settings.models
    clash = sorted(set(served) & set(settings.model_names if given else ()))
    if clash:
        raise ConfigError(f"model {clash[0]!r} is both given with --model and in the "
                          "model repository: serve it from one of them")
    changes: dict[str, Any] = {"models": (*given, *(f"{m}={FROM_REPOSITORY}" for m in served))}
    for option in options:
        current: PerModel[Any] = option.get(settings)
        mine = {model for (model, label), _ in current.overrides if label is None}
        extra: list[tuple[ModelKey, Any]] = []
        for model in served:
            value = settings_of(snapshot.models[model], keys).get(option.name)
            if value is not None and model not in mine:
                extra += option.parse((f"{model}={value}",)).overrides
        if extra:
            changes[option.name] = PerModel(current.default, (*current.overrides, *extra))
    return replace(settings, **changes)


def load_all(s: WorkerSettings) -> dict[str, dict[str, ModelHandler]]:
    """``{model: {label: handler}}`` for ``--model`` and the repository's models: these as
    a :class:`ResidentHandler` each (loaded now unless models load on demand), serving
    the latest complete version under the default label."""
    own = tuple(spec for spec in s.models if not from_repository(spec))
    versions = load_versions(own, s.max_batch_size, s.runtime_for, s.input_spec_for,
                             on_demand=s.on_demand) if own else {}
    if len(own) == len(s.models):
        return versions
    repo = Repository(s.model_repository)
    snapshot = repo.scan()
    for spec in s.models:
        name = spec.partition("=")[0].strip()
        if not from_repository(spec):
            continue
        entry = snapshot.models.get(name)
        if entry is None or entry.latest is None:
            raise ConfigError(f"model {name!r}: no complete version in {repo.url} (a version "
                              f"folder is complete once it holds {READY})")
        found = version_maker(s, repo, entry, entry.latest)
        versions[name] = {DEFAULT_LABEL: ResidentHandler(
            name, found.make, keep=not s.on_demand, tag=entry.latest, source=found.source,
            sample=found.sample)}
    return versions


@dataclass(frozen=True, slots=True)
class VersionSource:
    """What builds one version's handler (as ``--model NAME=SOURCE`` would), where it
    comes from, and its warm-up sample file ("": none)."""

    make: Callable[[], ModelHandler]
    source: str
    sample: str = ""


def version_maker(s: WorkerSettings, repo: Repository, entry: ModelEntry,
                  version: str) -> VersionSource:
    folder = repo.local_version(entry.name, version)
    make = partial(load_model, f"{entry.name}={source_of(entry, folder)}", s.max_batch_size,
                   s.runtime_for(entry.name), s.input_spec_for(entry.name))
    sample = entry.config.get("warmup_sample")
    return VersionSource(make, f"{repo.url.rstrip('/')}/{entry.name}/{version}",
                         f"{folder}/{sample}" if sample else "")
