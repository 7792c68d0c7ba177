"""Hub-Space-ready `evaluate` metric modules, shipped with hf_unlearn (see hf_unlearn.metric_path)."""
