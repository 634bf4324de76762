"""Where wirecut keeps its files.

Any layer may call ``default_data_dir()``; it only computes a path and creates
nothing, so callers make the folders they write to.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["CACHE_DIR_ENV", "DATA_DIR_ENV", "default_cache_dir", "default_data_dir"]

#: The environment variable that overrides the platform's user data folder.
DATA_DIR_ENV = "WIRECUT_DATA_DIR"
#: The environment variable that overrides the platform's user cache folder.
CACHE_DIR_ENV = "WIRECUT_CACHE_DIR"


def default_data_dir() -> Path:
    """The data directory when ``--data-dir`` is not given.

    ``WIRECUT_DATA_DIR`` when it is set and not empty, else the platform's user
    data folder for "wirecut" (``~/.local/share/wirecut`` on Linux). Safe to
    call from any thread; reads the environment at each call.
    """
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("wirecut", appauthor=False))


def default_cache_dir() -> Path:
    """Where downloaded and assembled models live, shared by every data directory.

    ``WIRECUT_CACHE_DIR`` when it is set and not empty, else the platform's
    user cache folder for "wirecut" (``~/.cache/wirecut`` on Linux). Safe to
    call from any thread; reads the environment at each call.
    """
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("wirecut", appauthor=False))
