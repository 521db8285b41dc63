"""gymkube env server and session router."""
