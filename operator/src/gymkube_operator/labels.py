"""Label keys the operator writes on its children and selects them by, each named once."""

COMPONENT_LABEL = "app.kubernetes.io/component"
POOL_LABEL = "gymkube.io/envpool"
"""On an EnvPool's children: the pool they belong to."""
POOL_CLIENT_LABEL = "gymkube.io/envpool-client"
"""On a TrainingRun's pods: the pool they play, which that pool's NetworkPolicy lets in."""


def pool_client_label(pool: str) -> str:
    """On the pods of a TrainingRun over envPools, one per pool (value "true"): each pool's
    NetworkPolicy lets in the pods that carry its own."""
    return f"clients.gymkube.io/{pool}"


RUN_LABEL = "gymkube.io/trainingrun"
"""On a TrainingRun's children: the run they belong to."""
EVAL_RUN_LABEL = "gymkube.io/evalrun"
"""On an EvalRun's children: the eval they belong to."""
