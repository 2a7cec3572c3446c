"""The engine: findings, causes, the registry, the runner, reports and their renderers."""
