"""A stand-in for llama.cpp's `llama-server` (its native API where the bench uses it): the
baseline plumbing of `kvdeck bench` is tested against this, in CI, without building llama.cpp.

Run as a program it takes llama-server's flags (`-m`, `--port`, `-t`, ...) and writes them,
and every request body, one JSON line each, to $FAKE_LLAMA_LOG. In a test it can also serve
from a thread (`serve_in_thread`), with `tokenize_field="prompt"` to answer `/tokenize` as
vLLM and kvdeck do, so that it can stand for the server under test as well.

Its "model" is arithmetic: the greedy continuation of a prompt is (sum of the prompt + i) % 97,
and each generated token "takes" `FAKE_MS_PER_TOKEN` ms in its timings.

With $FAKE_LLAMA_SIGNAL set (a signal number) it dies of that signal at start, after a log line
of llama.cpp's CPU repack, as llama-server does where the repack crashes; run as
`fake_llama_server.py bench ...` it stands for `llama-bench` instead (`bench_main`).
"""

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAKE_MS_PER_TOKEN = 2.0
TOKENIZE_IDS = {"content": list(range(0, 40)), "prompt": list(range(10, 60))}


def continuation(prompt: list[int], n: int) -> list[int]:
    base = sum(prompt)
    return [(base + i) % 97 for i in range(n)]


def make_handler(model: str, tokenize_field: str, log_path: str | None):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _json(self, body: dict, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _log(self, body: dict) -> None:
            if log_path:
                with open(log_path, "a") as log:
                    log.write(json.dumps({"path": self.path, "body": body}) + "\n")

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json({"status": "ok"})
            elif self.path == "/v1/models":
                self._json({"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._json({"error": "not found"}, 404)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            self._log(body)
            if self.path == "/tokenize":
                # llama.cpp answers a body without `content` with an empty list, not an error.
                self._json({"tokens": TOKENIZE_IDS[tokenize_field] if tokenize_field in body else []})
            elif self.path == "/completion":
                n = int(body["n_predict"])
                self._json({"content": "x" * n, "tokens": continuation(body["prompt"], n),
                            "timings": {"prompt_n": len(body["prompt"]), "prompt_ms": 1.0,
                                        "predicted_n": n, "predicted_ms": n * FAKE_MS_PER_TOKEN}})
            elif self.path == "/v1/completions":
                self._stream(body)
            else:
                self._json({"error": "not found"}, 404)

        def _stream(self, body: dict) -> None:
            n = int(body["max_tokens"])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chunks = [{"choices": [{"text": f"t{token} ", "index": 0, "finish_reason": None}]}
                      for token in continuation(body["prompt"], n)]
            chunks.append({"choices": [{"text": "", "index": 0, "finish_reason": "length"}],
                           "usage": {"completion_tokens": n, "prompt_tokens": len(body["prompt"])}})
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    return Handler


def serve_in_thread(model: str = "fake", tokenize_field: str = "content",
                    log_path: str | None = None) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(model, tokenize_field, log_path))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def bench_main(argv: list[str]) -> int:
    """llama-bench's `-o json` for its tg test: FAKE_MS_PER_TOKEN ms per token."""
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", dest="model", required=True)
    parser.add_argument("-n", dest="n_gen", type=int, default=128)
    parser.add_argument("-p", dest="n_prompt", type=int, default=512)
    parser.add_argument("-d", dest="n_depth", type=int, default=0)
    parser.add_argument("-o", dest="output", default="md")
    args, _ = parser.parse_known_args(argv)
    _log_argv(argv)
    _die_if_asked()
    avg_ts = 1e3 / FAKE_MS_PER_TOKEN
    print(json.dumps([{"model_filename": args.model, "n_prompt": args.n_prompt, "n_gen": args.n_gen,
                       "n_depth": args.n_depth, "avg_ts": avg_ts, "samples_ts": [avg_ts]}], indent=2))
    return 0


def _log_argv(argv: list[str]) -> None:
    log_path = os.environ.get("FAKE_LLAMA_LOG")
    if log_path:
        with open(log_path, "a") as log:
            log.write(json.dumps({"argv": argv}) + "\n")


def _die_if_asked() -> None:
    number = os.environ.get("FAKE_LLAMA_SIGNAL")
    if number:
        print("load_tensors:   CPU_REPACK model buffer size =    54.00 MiB", flush=True)
        os.kill(os.getpid(), int(number))


def main(argv: list[str]) -> int:
    if argv[:1] == ["bench"]:
        return bench_main(argv[1:])
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", dest="model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args(argv)
    _log_argv(argv)
    _die_if_asked()
    log_path = os.environ.get("FAKE_LLAMA_LOG")
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.model, "content", log_path))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
