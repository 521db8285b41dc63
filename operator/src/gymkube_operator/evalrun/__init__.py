"""The EvalRun resource: score a model on held-out episodes through an EnvPool."""
