"""What every benchmark here shares: one failed section is reported, never the loss of the rest.

A section's result goes into the report as soon as it is measured; a section that raises is
recorded as `{"failed": "<error>"}`, the later sections still run, and `finish` prints the report
and exits 1 if any section failed.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

FAILED = "failed_sections"


def _record_failure(report: dict[str, Any], name: str, error: BaseException) -> None:
    traceback.print_exception(error, file=sys.stderr)
    report[name] = {"failed": f"{type(error).__name__}: {error}"}
    report.setdefault(FAILED, []).append(name)


def run_section(report: dict[str, Any], name: str, measure: Callable[[], Any]) -> None:
    try:
        report[name] = measure()
    except Exception as error:  # any failure of one section: the others still count
        _record_failure(report, name, error)


async def run_async_section(
    report: dict[str, Any], name: str, measure: Callable[[], Awaitable[Any]]
) -> None:
    try:
        report[name] = await measure()
    except Exception as error:  # as run_section
        _record_failure(report, name, error)


def finish(report: dict[str, Any]) -> None:
    print(json.dumps(report, indent=2), flush=True)
    if report.get(FAILED):
        sys.exit(1)
