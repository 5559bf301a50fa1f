"""What is kept on disk to make loading fast, below the model and the engine that read it:
the parsed header and tokenizer files (header_cache), the packed weights (packed_cache),
what their entries are keyed by (kernel_identity), the atomic writes every file on disk
goes through (atomic_file), and replacing and deleting files a reader may hold open, which
Windows refuses (in_use). Nothing here imports the model, the engine or anything above
them: what the caches read of a model file, they are handed."""
