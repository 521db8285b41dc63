"""Label keys the operator writes on its children and selects them by, each named once."""

COMPONENT_LABEL = "app.kubernetes.io/component"
POOL_LABEL = "gymkube.io/envpool"
"""On an EnvPool's children: the pool they belong to."""
POOL_CLIENT_LABEL = "gymkube.io/envpool-client"
"""On a TrainingRun's pods: the pool they play, which that pool's NetworkPolicy lets in."""
RUN_LABEL = "gymkube.io/trainingrun"
"""On a TrainingRun's children: the run they belong to."""
