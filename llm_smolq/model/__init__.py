"""The model a GGUF file holds: its header read, its description (config and tensor table),
its tokenizer, and whether it fits in memory."""
