"""What the plugin keeps on disk for its user: the catalog of model files (catalog), how
the known ones are downloaded (download, pypi_models), and the prompt cache (prompt_cache
over its block format, kv_blocks). It reads the model, the engine and the chat template;
the low-level caches they read are in llm_smolq.cache."""
