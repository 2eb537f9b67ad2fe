"""The terminal front end: the interactive chat, terminal-safe text, progress bars."""
