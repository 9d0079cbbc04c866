"""The training frameworks: which one a run uses and its typed settings, one module per framework."""
