"""A short soak run (``make soak`` runs minutes): mixed hostile load, no errors, no leak."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_fuse, time_limit
from tests.soak import soak

pytestmark = pytest.mark.fuse


def test_short_soak_has_no_errors_no_wrong_bytes_and_no_leak(tmp_path: Path) -> None:
    require_fuse()
    report = soak(8, tmp_path, every_action=True, longest=time_limit(300))
    assert report["errors"] == 0 and report["wrong"] == 0, report
    assert report["reads"] > 1000 and report["kills"] and report["storms"] and report["busy_unmounts"], report
    start, end = report["start"], report["end"]
    assert end["fds"] == start["fds"], report  # every descriptor the load opened was closed
    assert end["rss_kib"] - start["rss_kib"] < 16 * 1024, report
