"""The broker's rule book: plain functions over the models, called by every edge.

See docs/architecture.md.
"""
