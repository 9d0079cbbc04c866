"""Plain-words findings, one module per framework (``deepspeed``, ``pytorch``) beside the shared pieces."""
