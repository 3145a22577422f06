"""build_app, running the server, hot reload, admin routes."""
