"""Attach tests run against a live `kvdeck --serve` (the serve tests' fixtures) or fakes."""

from tests.serve.conftest import serve_model_dir  # noqa: F401  (a fixture)
