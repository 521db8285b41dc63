"""The `make up` / `make down` command line: settings refused before anything starts, a step's
failure as one error line, never a traceback."""

import sys
import time

from pydantic import ValidationError

from gymkube_dev.commands import down, up
from gymkube_dev.console import duration, say
from gymkube_dev.errors import StepError
from gymkube_dev.settings import UpSettings

USAGE = "usage: hack/up.py up|down"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("up", "down"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        settings = UpSettings()
    except ValidationError as err:
        for problem in err.errors():
            name = "GYMKUBE_UP_" + "_".join(str(part) for part in problem["loc"]).upper()
            print(f"make {argv[0]}: {name}: {problem['msg']}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        up(settings) if argv[0] == "up" else down(settings)
    except StepError as err:
        print(f"\nmake {argv[0]}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nmake {argv[0]}: interrupted; run it again to carry on", file=sys.stderr)
        return 130
    say(f"make {argv[0]}: done in {duration(time.monotonic() - started)}")
    return 0
