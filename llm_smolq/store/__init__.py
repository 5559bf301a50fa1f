"""What lives on disk: the model catalog and downloads, the header cache, the prompt cache,
and the atomic writes they share."""
