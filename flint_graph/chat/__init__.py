"""The GLM-4.7 chat format: the template, messages, the tokenizer, and reading the model's output (reasoning, content, tool calls typed by their schemas)."""
