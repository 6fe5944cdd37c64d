"""GGUF files into kvdeck's store: reading the header (header.py), the config and tokenizer
files made from its metadata (config.py), its tensors dequantised into safetensors
(tensors.py), the import that ties them together (importer.py) and the GGUFs other local
tools keep, found for import (discovery.py)."""
