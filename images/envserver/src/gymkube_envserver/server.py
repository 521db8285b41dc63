"""``gymkube-envserver``: run the env server (flags or GYMKUBE_* environment variables)."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError
from pydantic_settings import CliApp, SettingsError

from gymkube_envserver.app import create_app
from gymkube_envserver.envs import EnvSpecError
from gymkube_envserver.settings import ServerSettings


def main(argv: list[str] | None = None) -> None:
    try:
        settings = CliApp.run(ServerSettings, cli_args=sys.argv[1:] if argv is None else argv)
        app = create_app(settings)
    except (ValidationError, SettingsError, EnvSpecError) as exc:
        print(f"gymkube-envserver: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # py4j logs every JVM shutdown with a traceback at INFO; ScienceWorld logs every task load.
    for chatty in ("py4j", "scienceworld"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        loop="uvloop",
        http="httptools",
        access_log=False,
        timeout_graceful_shutdown=30,
    )


if __name__ == "__main__":
    main()
