"""The model a GGUF file holds: its header read (from the header cache when unchanged), its
description (config and tensor table), and its tokenizer."""
