"""A benchmark whose later section fails still prints the sections it finished, and fails."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[3] / "bench"


def test_a_failed_section_keeps_the_finished_ones_and_fails_the_run(tmp_path: Path) -> None:
    script = tmp_path / "bench_like.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import asyncio, sys
            sys.path.insert(0, {str(BENCH)!r})
            from sections import finish, run_async_section, run_section

            async def broken():
                raise RuntimeError("the pool went away")

            report = {{}}
            run_section(report, "first", lambda: {{"p50_ms": 1.5}})
            asyncio.run(run_async_section(report, "second", broken))
            run_section(report, "third", lambda: {{"p50_ms": 2.5}})
            finish(report)
            """
        )
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["first"] == {"p50_ms": 1.5}
    assert report["third"] == {"p50_ms": 2.5}
    assert report["second"] == {"failed": "RuntimeError: the pool went away"}
    assert report["failed_sections"] == ["second"]
    assert "the pool went away" in done.stderr
