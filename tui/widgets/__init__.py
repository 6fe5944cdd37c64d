"""kvdeck's widgets: one widget per module."""
