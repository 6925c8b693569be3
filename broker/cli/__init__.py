"""The console's nouns, one module each, dispatched by the ferry command (docs/console.md)."""
