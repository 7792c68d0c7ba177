"""Build script: metadata lives in setup.cfg; this file only maps the top-level Hub artifacts.

`evaluate_metrics/` and `hub_cards/` sit at the repository root (they are Hub artifacts) and are
installed inside the package as `hf_unlearn.evaluate_metrics` and `hf_unlearn.hub_cards`, so a
non-editable wheel install finds them through `hf_unlearn.metric_path` and `hf_unlearn.hub`.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["hf_unlearn", "hf_unlearn.*"])
    + ["hf_unlearn.evaluate_metrics", "hf_unlearn.hub_cards"],
    package_dir={
        "hf_unlearn.evaluate_metrics": "evaluate_metrics",
        "hf_unlearn.hub_cards": "hub_cards",
    },
)
