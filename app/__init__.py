"""The `kvdeck` command: CLI, process start/stop, HTTP server, model store."""
