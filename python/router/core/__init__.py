"""The request pipeline: per-request context, stages, the driver, the attempt path, the seam."""
