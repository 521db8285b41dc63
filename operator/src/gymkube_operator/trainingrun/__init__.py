"""TrainingRun: a verl training job wired to an EnvPool, with preflight, KubeRay and Kueue."""
