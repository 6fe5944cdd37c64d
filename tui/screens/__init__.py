"""kvdeck's screens: one screen per module."""
