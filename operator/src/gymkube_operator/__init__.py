"""gymkube Kubernetes operator."""
