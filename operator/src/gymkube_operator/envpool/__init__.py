"""EnvPool: a pool of env-server pods behind one session router URL."""
