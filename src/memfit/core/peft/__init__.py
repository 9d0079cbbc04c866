"""PEFT methods: the typed spec, reading adapter_config.json, and the parameters each method adds."""
