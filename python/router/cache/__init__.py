"""The response cache: policy, tiers, the shared Redis tier, coalescing."""
