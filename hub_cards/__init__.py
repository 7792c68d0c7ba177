"""Model-card templates for unlearned artifacts, shipped with hf_unlearn (see hf_unlearn.hub)."""
