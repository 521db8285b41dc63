"""``/status`` of a router replica: the pool as it sees it, backend by backend."""

from __future__ import annotations

import time

from pydantic import BaseModel

from gymkube_envserver.router.pool import Backend, BackendState, Pool


class BackendView(BaseModel):
    address: str
    state: BackendState
    capacity: int
    active: int
    warm: int
    draining: bool
    ready: bool
    served: int
    placed: int
    errors: int
    lost: int
    last_error: str | None
    last_poll_age_s: float | None


class RouterStatus(BaseModel):
    """The pool as one router replica sees it; totals count backends that take sessions."""

    ready: bool
    capacity: int
    active: int
    warm: int
    free: int
    backends_ready: int
    backends_total: int
    placed: int
    errors: int
    lost: int
    # Creates held for room right now: sessions the pool does not have yet.
    waiting: int
    backends: list[BackendView]


def pool_status(pool: Pool) -> RouterStatus:
    now = time.time()
    views = [_backend_view(backend, now) for backend in pool.backends.values()]
    taking = [view for view in views if view.state == "ready"]
    return RouterStatus(
        ready=bool(taking),
        capacity=sum(view.capacity for view in taking),
        active=sum(view.active for view in taking),
        warm=sum(view.warm for view in taking),
        free=sum(max(0, backend.free) for backend in pool.backends.values() if backend.placeable),
        backends_ready=len(taking),
        backends_total=len(views),
        placed=sum(view.placed for view in views),
        errors=sum(view.errors for view in views),
        lost=sum(view.lost for view in views),
        waiting=pool.waiting,
        backends=views,
    )


def _backend_view(backend: Backend, now: float) -> BackendView:
    status = backend.status
    return BackendView(
        address=backend.address,
        state=backend.state,
        capacity=status.capacity if status else 0,
        active=status.active if status else 0,
        warm=status.warm if status else 0,
        draining=status.draining if status else False,
        ready=backend.placeable,
        served=status.served if status else 0,
        placed=backend.placed,
        errors=backend.errors,
        lost=backend.lost,
        last_error=backend.last_error,
        last_poll_age_s=None if backend.last_poll_at is None else now - backend.last_poll_at,
    )
