"""`kvdeck`'s command-line errors name the wrong word, suggest the right one, exit 2, and stay
short: one line of usage and a pointer to --help, never the whole usage."""

import pytest

from kvdeck.app.cli import main

USAGE = "usage: kvdeck [--model MODEL] [--serve] [OPTION ...] | kvdeck COMMAND ..."


def fails(argv: list[str], capsys) -> list[str]:
    """The error's lines, after checking the exit code and that nothing went to stdout."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


@pytest.fixture
def no_tui(monkeypatch):
    """Opening the TUI (or the server) would be the bug: fail loudly instead."""
    import kvdeck.app.serve.server
    import kvdeck.tui.launch

    def opened(*args, **kwargs):
        raise AssertionError("opened despite a command-line error")

    monkeypatch.setattr(kvdeck.tui.launch, "run_tui", opened)
    monkeypatch.setattr(kvdeck.app.serve.server, "run_server", opened)


def test_an_unknown_option_is_named_with_its_close_match(capsys, no_tui):
    assert fails(["--modle", "demo"], capsys) == [
        "kvdeck: error: unknown option --modle; did you mean --model?", USAGE, "see kvdeck --help"]
    assert fails(["--modle=demo", "--serve"], capsys)[0] == \
        "kvdeck: error: unknown option --modle; did you mean --model?"
    assert fails(["--serve", "--kv-cache-memory-gb", "2"], capsys)[0] == \
        "kvdeck: error: unknown option --kv-cache-memory-gb; did you mean --kv-cache-memory-gib?"


def test_an_unknown_option_without_a_close_match_is_named_alone(capsys, no_tui):
    assert fails(["--xyzzy"], capsys) == [
        "kvdeck: error: unknown option --xyzzy", USAGE, "see kvdeck --help"]


def test_serve_as_a_command_points_to_the_flag(capsys, no_tui):
    assert fails(["serve", "--model", "demo"], capsys) == [
        "kvdeck: error: unknown command 'serve'; did you mean `kvdeck --serve`?", USAGE,
        "see kvdeck --help"]


def test_an_unknown_command_gets_the_nearest_or_the_list(capsys, no_tui):
    assert fails(["modles"], capsys)[0] == \
        "kvdeck: error: unknown command 'modles'; did you mean `kvdeck models`?"
    assert fails(["frobnicate"], capsys)[0] == (
        "kvdeck: error: unknown command 'frobnicate'; the commands are pull, models, rm, import, "
        "quantize, eval-ppl, bench, attach, plan, replay")


@pytest.mark.parametrize("argv, flags", [
    (["--port", "8013"], "--port only applies"),
    (["--por", "8013"], "--port only applies"),  # argparse's abbreviation, named in full
    (["--model", "demo", "--host", "0.0.0.0", "--api-key", "k"], "--host, --api-key only apply"),
    (["--served-model-name", "x", "--tool-call-parser", "hermes"],
     "--served-model-name, --tool-call-parser only apply"),
    (["--no-restart-engine", "--allowed-origins", "*"],
     "--no-restart-engine, --allowed-origins only apply"),
    (["--model", "models", "--port", "1"], "--port only applies"),  # a value, not the command
    (["--port", "8013", "models"], "--port only applies"),
])
def test_server_flags_without_serve_are_refused(argv, flags, capsys, no_tui):
    assert fails(argv, capsys) == [f"kvdeck: error: {flags} with --serve", USAGE,
                                   "see kvdeck --help"]


def test_server_flags_with_serve_reach_the_server(monkeypatch):
    import kvdeck.app.serve.server

    seen = {}

    def run_server(args, engine_kwargs, requested_model=None):
        seen.update(port=args.port, host=args.host, model=requested_model)
        return 0

    monkeypatch.setattr(kvdeck.app.serve.server, "run_server", run_server)
    assert main(["--port", "8013", "--serve", "--model", "demo", "--host", "::1"]) == 0
    assert seen == {"port": 8013, "host": "::1", "model": "demo"}


def test_a_bad_value_keeps_argparse_s_message_and_stays_short(capsys, no_tui):
    assert fails(["--serve", "--port", "abc"], capsys) == [
        "kvdeck: error: argument --port: invalid int value: 'abc'", USAGE, "see kvdeck --help"]
    assert fails(["--model", "--serve"], capsys)[0] == \
        "kvdeck: error: argument --model: expected one argument"


def test_a_subcommand_s_errors_name_the_subcommand(capsys, kvdeck_env):
    assert fails(["models", "--jsn"], capsys) == [
        "kvdeck models: error: unknown option --jsn; did you mean --json?", "see kvdeck models --help"]
    assert fails(["bench", "thruput"], capsys)[0] == \
        "kvdeck bench: error: unknown command 'thruput'; did you mean `kvdeck bench throughput`?"
    # --model, as `kvdeck` and `kvdeck bench` take it, where the model is an argument.
    assert fails(["quantize", "--model", "demo"], capsys)[0] == (
        "kvdeck quantize: error: unknown option --model: give the model as an argument, "
        "`kvdeck quantize SOURCE ...`")
    assert fails(["eval-ppl", "--model=demo", "--file", "f.txt"], capsys)[0] == (
        "kvdeck eval-ppl: error: unknown option --model: give the model as an argument, "
        "`kvdeck eval-ppl MODEL ...`")
    lines = fails(["pull"], capsys)
    assert lines[0] == "kvdeck pull: error: the following arguments are required: repo_id"
    assert len(lines) <= 3 and lines[-1] == "see kvdeck pull --help"
