"""gymkube verl AgentLoop and env-pool client."""
