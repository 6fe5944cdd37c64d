"""Smoke test: the real `kvdeck` in a real terminal (tmux), chatting with a tiny model."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow(seconds=30),  # the chat test about 30 s, the hang-up tests 15 and 20
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("tmux") is None,
                       reason="tmux is not installed (apt-get install tmux)"),
]

REPO = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 140, 40


SOCKET = f"kvdeck-test-{os.getpid()}"  # a private tmux server: other sessions are untouched


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], check=True, capture_output=True,
                          text=True).stdout


def capture(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def wait_for_screen(session: str, predicate, timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        try:
            screen = capture(session)
        except subprocess.CalledProcessError:  # the session ended
            break
        if predicate(screen):
            return screen
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; the screen was:\n{screen}")


def wait_for_file(folder: Path, predicate, timeout: float, what: str) -> dict:
    """Poll the one transcript in `folder` until predicate(its JSON) holds."""
    deadline = time.monotonic() + timeout
    data: dict = {}
    while time.monotonic() < deadline:
        for path in folder.glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced: read it again
            if predicate(data):
                return data
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}; the transcript was:\n{data}")


def reply_lines(screen: str) -> list[str]:
    """The chat pane's text lines of the reply (between "Assistant" and its figures)."""
    lines = [line[:WIDTH * 2 // 5] for line in screen.splitlines()]  # the chat column only
    starts = [i for i, line in enumerate(lines) if line.strip(" ▕▎▊") == "Assistant"]
    if not starts:
        return []
    text = []
    for line in lines[starts[-1] + 1:]:
        if "TTFT" in line or line.strip().startswith(("max ", "generating")):
            break
        if line.strip(" ▕▎▊"):
            text.append(line)
    return text


def test_kvdeck_in_tmux_multi_turn_chat_stop_and_quit(tiny_llama_dir, tmp_path):
    session = f"kvdeck-smoke-{uuid.uuid4().hex[:8]}"
    exit_file = tmp_path / "exit_code"
    command = " ".join([
        shlex.quote(sys.executable), "-m", "kvdeck.app.cli",
        "--model", shlex.quote(str(tiny_llama_dir)),
        "--device", "cpu", "--num-gpu-blocks-override", "128", "--max-model-len", "512",
        "--attention-backend", "torch",
    ])
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "TERM": "xterm-256color",
           "PYTHONPATH": str(REPO)}
    env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    # tmux passes COLUMNS/LINES of its default size (80x24) when started without a terminal;
    # unset them so the app measures the real pane.
    shell = (f"cd {shlex.quote(str(REPO))} && unset COLUMNS LINES && {env_prefix} {command}; "
             f"echo $? > {exit_file}")
    tmux("new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", str(HEIGHT), shell)
    try:
        wait_for_screen(session, lambda s: "Enter sends" in s and "Starting the engine" not in s,
                        timeout=150, what="the engine to be ready")
        tmux("send-keys", "-t", session, "-l", "hello there")
        tmux("send-keys", "-t", session, "Enter")
        wait_for_screen(session, lambda s: "You" in s and "hello there" in s
                        and "Assistant" in s, timeout=30, what="the message to be sent")
        wait_for_screen(session, lambda s: bool(reply_lines(s)), timeout=60,
                        what="the reply to stream in")
        # Esc stops the reply; a random tiny model may also end it by itself (EOS) first.
        tmux("send-keys", "-t", session, "Escape")
        screen = wait_for_screen(session, lambda s: "TTFT" in s and "running 0" in s,
                                 timeout=30, what="the reply's figures")
        assert "tokens" in screen and ("stopped" in screen or "finished 1" in screen)
        assert reply_lines(screen), f"no reply text on screen:\n{screen}"
        # More turns: each one is sent with the history that fits, and answered.
        transcripts = tmp_path / "data" / "kvdeck" / "transcripts"
        tmux("send-keys", "-t", session, "-l", "and a second question")
        tmux("send-keys", "-t", session, "Enter")
        wait_for_file(transcripts, lambda data: len(data["turns"]) == 4
                      and bool(data["turns"][-1]["stats"]), timeout=60, what="reply 2 to finish")
        # A pasted snippet keeps all its lines (a bracketed paste; tmux sends its line feeds
        # as CR, as many terminals do), ctrl+j adds one, and only Enter sends.
        tmux("set-buffer", "-b", "snippet", "a third one, please\n    indented line")
        tmux("paste-buffer", "-p", "-d", "-b", "snippet", "-t", session)
        tmux("send-keys", "-t", session, "C-j")
        tmux("send-keys", "-t", session, "-l", "last line")
        tmux("send-keys", "-t", session, "Enter")
        data = wait_for_file(transcripts, lambda data: len(data["turns"]) == 6
                             and bool(data["turns"][-1]["stats"]), timeout=60,
                             what="reply 3 to finish")
        assert data["turns"][4]["content"] == "a third one, please\n    indented line\nlast line"
        screen = wait_for_screen(session, lambda s: "max 128 tok · ctx 512" in s, timeout=10,
                                 what="the status line to name the reply budget and context")
        assert "a third one" in screen and "Assistant" in screen
        tmux("send-keys", "-t", session, "C-c")
        deadline = time.monotonic() + 60
        while not exit_file.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert exit_file.exists(), "kvdeck did not exit after ctrl+c"
        assert exit_file.read_text().strip() == "0"
        saved = list(transcripts.glob("*.json"))
        assert len(saved) == 1
        turns = json.loads(saved[0].read_text())["turns"]
        assert [t["role"] for t in turns] == ["user", "assistant"] * 3
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)


def _processes_under(pid: int) -> set[int]:
    """pid and every descendant of it."""
    found, frontier = {pid}, [pid]
    while frontier:
        out = subprocess.run(["pgrep", "-P", str(frontier.pop())], capture_output=True, text=True)
        children = {int(p) for p in out.stdout.split()}
        frontier.extend(children - found)
        found |= children
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("pgrep") is None,
                    reason="needs make and pgrep")
@pytest.mark.parametrize(("under_make", "open_for_s"), [(True, 0.0), (False, 4.0)],
                         ids=["under-make", "after-a-while"])
def test_kvdeck_quits_with_its_engine_when_the_terminal_goes_away(tiny_llama_dir, tmp_path,
                                                                   under_make, open_for_s):
    """Closing the terminal must end kvdeck and its engine.

    Under `make`, as the README's run command runs it: closing the terminal kills make but
    does not pass the hang-up on, and kvdeck used to keep running (spinning on the dead
    terminal, its engine alive). Run directly and left open a few seconds: Textual's output
    thread died of the hung-up terminal and kvdeck's next write blocked on its full queue,
    so the app stayed behind (its engine gone, the process not)."""
    session = f"kvdeck-hup-{uuid.uuid4().hex[:8]}"
    command = " ".join([
        shlex.quote(sys.executable), "-m", "kvdeck.app.cli",
        "--model", shlex.quote(str(tiny_llama_dir)),
        "--device", "cpu", "--num-gpu-blocks-override", "64", "--max-model-len", "256",
    ])
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "TERM": "xterm-256color",
           "PYTHONPATH": str(REPO)}
    shell = (f"cd {shlex.quote(str(REPO))} && unset COLUMNS LINES && "
             + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f" {command}")
    if under_make:
        makefile = tmp_path / "Makefile"
        makefile.write_text(f"run:\n\t{shell}\n")
        shell = f"make -f {shlex.quote(str(makefile))} run"
    tmux("new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", str(HEIGHT), shell)
    try:
        wait_for_screen(session, lambda s: "Enter sends" in s and "Starting the engine" not in s,
                        timeout=150, what="the engine to be ready")
        time.sleep(open_for_s)
        pane_pid = int(tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
        kvdeck = _processes_under(pane_pid) - ({pane_pid} if under_make else set())
        assert len(kvdeck) >= 2, "expected the app and its engine process"
        tmux("kill-session", "-t", session)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in kvdeck):
            time.sleep(0.5)
        left = [pid for pid in kvdeck if _alive(pid)]
        assert not left, f"still running after the terminal closed: {left}"
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
