"""Chat handling: the model's own chat template in a sandbox, the reasoning split, tool calls."""
