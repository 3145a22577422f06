"""HTTP/1.1 client pool, SSE, idle timers and stream responses."""
