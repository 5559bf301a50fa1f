"""The engine: weights and KV cache behind eval, the buffer gate every array passes before
the kernel sees it, and the structs the kernel reads."""
