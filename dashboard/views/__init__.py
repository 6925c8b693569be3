"""Console views, one module per page (docs/console-ui.md): authenticate, one core call, render."""
