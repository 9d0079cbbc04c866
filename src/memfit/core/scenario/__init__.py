"""A training scenario: every input a plan needs (``types``), read from YAML, flags and the user's files."""
