"""Renderers: typed results in, text out. They never recompute a number."""
