"""Pure functions over a loaded run. Nothing here imports torch or Lightning."""
