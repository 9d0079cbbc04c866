"""``memfit recommend`` under DeepSpeed: the candidate space and the fast estimator of the ledger."""
