"""The dialogs' layout: every text is drawn whole (a long one wraps inside the dialog), every
field's label above its input, and a blank field's default shows in the field itself."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Input, Label

from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.load_generator import LoadSpec
from kvdeck.tui.screens.chat_settings import ChatSettingsScreen
from kvdeck.tui.screens.load_generator import LoadGeneratorScreen


class DialogApp(App):
    def __init__(self, dialog: Screen) -> None:
        super().__init__()
        self.dialog = dialog

    def on_mount(self) -> None:
        self.push_screen(self.dialog)


@pytest.mark.parametrize(("size", "max_model_len", "auto"),
                         [((160, 48), 8192, "auto: 1024"), ((80, 24), 2048, "auto: 512"),
                          ((80, 24), None, "auto")])
async def test_the_sampling_fields_show_their_labels_and_defaults(size, max_model_len, auto):
    app = DialogApp(ChatSettingsScreen(ChatSettings(), max_model_len))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        screen = app.screen
        labels = list(screen.query("Grid Label").results(Label))
        inputs = list(screen.query("Grid Input").results(Input))
        assert [str(label.render()) for label in labels] == [
            "temperature", "top_p", "max_tokens", "seed"]
        for label, field in zip(labels, inputs, strict=True):
            text = str(label.render())
            assert label.region.height == 1 and label.region.width >= len(text), text
            assert label.region.bottom <= field.region.y, text  # above its field, not under it
        max_tokens, seed = screen.query_one("#max-tokens", Input), screen.query_one("#seed", Input)
        assert (max_tokens.placeholder, seed.placeholder) == (auto, "random")
        assert max_tokens.content_region.width >= len(auto)  # the hint fits its field


@pytest.mark.parametrize("size", [(160, 48), (80, 24)])
async def test_the_load_generator_says_what_it_fires_in_full(size):
    app = DialogApp(LoadGeneratorScreen(LoadSpec(), 2048))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        intro = app.screen.query_one("#load-intro")
        dialog = app.screen.query_one(Vertical)
        text = Text(str(intro.render()))
        assert text.plain.endswith("share its cached blocks.")
        assert intro.region.width <= dialog.content_region.width  # inside the dialog
        lines = text.wrap(app.console, intro.content_size.width)
        assert len(lines) >= 2 and intro.region.height == len(lines)  # wrapped, every line shown
