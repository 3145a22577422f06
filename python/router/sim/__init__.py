"""A simulated OpenAI-compatible region for the demo, tests and benchmarks."""
