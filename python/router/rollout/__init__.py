"""Model versions: the version table, canary monitoring, rollout admin."""
