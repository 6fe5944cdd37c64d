"""schemathesis against the live server's own OpenAPI document, every check: no 5xx, no
response that disagrees with the document (statuses, content types, schemas, headers)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.conftest import start_server, stop_server

pytestmark = pytest.mark.timeout(400)
CONFIG = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = 25  # per operation


@pytest.mark.slow(seconds=25)
def test_schemathesis_finds_nothing(serve_model_dir, tmp_path):
    # A short context keeps every generated completion quick.
    server = start_server(serve_model_dir, tmp_path, "--max-model-len", "96", "--max-queue-len", "64")
    try:
        result = subprocess.run(
            [str(Path(sys.executable).with_name("schemathesis")), "--no-color", "--config-file",
             str(CONFIG), "run", f"{server.base_url}/openapi.json", "--checks", "all",
             "--max-examples", str(EXAMPLES), "--workers", "1", "--seed", "1",
             # An endless event stream (the dashboard's feed), tested in test_stats_stream.
             "--exclude-path", "/kvdeck/v1/stats"],
            cwd=tmp_path, capture_output=True, text=True, timeout=360)
    finally:
        stop_server(server)
    summary = re.search(r"(\d+) generated, (.*)", result.stdout)
    print(f"schemathesis: {summary.group(0) if summary else result.stdout[-500:]}")
    assert result.returncode == 0, result.stdout[-6000:]
