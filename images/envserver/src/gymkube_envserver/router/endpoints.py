"""The env-server paths the router knows, grouped by how it handles them (one list for all)."""

from __future__ import annotations

from gymkube_envserver.openenv_wire import HTTP_PATHS, WS_PATH

ANY_BACKEND_ENDPOINTS = frozenset({"/", "/tasks", *HTTP_PATHS})
"""GET endpoints every env server of a pool answers alike: proxied to any ready one."""
POOL_ENDPOINTS = frozenset(
    {"/healthz", "/readyz", "/status", "/metrics", "/create", *ANY_BACKEND_ENDPOINTS}
)
"""Served by the router itself or by any backend: not tied to a session."""
TUNNEL_ENDPOINT = WS_PATH
"""OpenEnv's session socket: placed at upgrade, then tunnelled to that backend."""
SESSION_ENDPOINTS = frozenset({"/reset", "/step", "/close", "/observation", "/detail"})
"""Routed to the backend named by the session id (in the body for POST, ``?id=`` for GET)."""
ID_RESPONSES = frozenset({"/create", "/reset", "/close", "/detail"})
"""Backend answers that carry the session id, which the router rewrites to its own form."""
KNOWN_ENDPOINTS = POOL_ENDPOINTS | SESSION_ENDPOINTS
"""Endpoint labels of the router's metrics; any other path is counted as ``other``."""
