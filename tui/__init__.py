"""kvdeck's terminal UI: chat beside a live view of the engine (Textual)."""
