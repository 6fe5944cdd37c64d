"""The chat settings dialog's layout: every field's label is drawn whole above its input,
and a blank field's default shows in the field itself."""

from __future__ import annotations

import pytest
from textual.app import App
from textual.widgets import Input, Label

from kvdeck.tui.chat_settings import ChatSettings
from kvdeck.tui.screens.chat_settings import ChatSettingsScreen


class SettingsApp(App):
    def __init__(self, max_model_len: int | None) -> None:
        super().__init__()
        self.max_model_len = max_model_len

    def on_mount(self) -> None:
        self.push_screen(ChatSettingsScreen(ChatSettings(), self.max_model_len))


@pytest.mark.parametrize(("size", "max_model_len", "auto"),
                         [((160, 48), 8192, "auto: 1024"), ((80, 24), 2048, "auto: 512"),
                          ((80, 24), None, "auto")])
async def test_the_sampling_fields_show_their_labels_and_defaults(size, max_model_len, auto):
    app = SettingsApp(max_model_len)
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
