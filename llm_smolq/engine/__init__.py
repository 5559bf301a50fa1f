"""The engine: weights and KV cache behind eval, the buffer gate every array passes before
the kernel sees it, the structs the kernel reads, and whether an engine fits in memory."""
