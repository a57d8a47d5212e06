"""JSON files that survive a crash: written to a temporary file, then renamed over the target.

A file can still be damaged outside this module's control (a full disk, a copy killed midway, an edit by
hand): :func:`read_json` then raises :class:`CorruptStateFile`, which names the file, and each reader says
what the file is for and whether it is safe to delete, or recovers.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["CorruptStateFile", "read_json", "read_json_or_redo", "write_json_atomic"]

log = logging.getLogger(__name__)


class CorruptStateFile(ValueError):
    """A state file of a sweep exists but cannot be read (truncated, empty, or not what it should hold).

    Attributes:
        path: the file.
        detail: what is wrong with it.
    """

    def __init__(self, path: Path, detail: str, advice: str = "") -> None:
        self.path, self.detail = path, detail
        super().__init__(f"{path} is unreadable ({detail}): it was probably truncated or emptied. {advice}".strip())


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` so that a reader sees either the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    """Return the JSON content of ``path``, or ``None`` if there is no such file.

    Raises:
        CorruptStateFile: if the file exists but is not valid JSON (e.g. empty or truncated).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as err:
        raise CorruptStateFile(path, f"not UTF-8 text: {err}") from err
    if not text.strip():
        raise CorruptStateFile(path, "the file is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise CorruptStateFile(path, f"invalid JSON: {err}") from err


def read_json_or_redo(path: Path, redo: str) -> Any | None:
    """:func:`read_json` for a file that records finished work: unreadable, it is set aside and the work redone.

    Args:
        path: the file.
        redo: what happens instead, for the warning (e.g. ``"the group is relaunched"``).

    Returns:
        The content, or ``None`` if the file is missing or unreadable (then renamed ``<name>.corrupt``).
    """
    try:
        return read_json(path)
    except CorruptStateFile as err:
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log.warning("%s is unreadable (%s); moved to %s, and %s.", path, err.detail, aside.name, redo)
        return None
