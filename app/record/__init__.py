"""Session recording and replay: `--record FILE` writes the engine's stats snapshots,
latencies, finished requests' timelines and step records into one SQLite file of compressed
~1 s chunks (format.py, writer.py); reader.py opens one for `kvdeck replay` and `kvdeck plan`.
"""
