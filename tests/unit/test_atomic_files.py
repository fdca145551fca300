"""Files ndplan writes appear whole, with the permissions a plain write would give."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ndplan.adapters.files import replace_atomically


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_gets_the_umask_mode_not_owner_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        replace_atomically(tmp_path / "ranking.csv", "a,b\n")
    finally:
        os.umask(old)
    assert (tmp_path / "ranking.csv").read_text() == "a,b\n"
    assert mode(tmp_path / "ranking.csv") == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["ranking.csv"]  # no temporary left


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    target.chmod(0o640)
    replace_atomically(target, "new")
    assert target.read_text() == "new" and mode(target) == 0o640
