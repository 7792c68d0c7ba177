"""The benchmark's subjects: the models unlearning methods are applied to, built once and cached.

- :mod:`.pretrained`: named pretrained subjects (``"smollm2-135m"``) resolved to a local float32 safetensors
  folder, from the Hub or from a GGUF in a pip package: :func:`resolve_subject`.
- :mod:`.tofu_small`: TOFU-small, TOFU on a pretrained subject: :class:`SmallRecipe` (v1 and v2 layouts),
  :func:`fine_tune_qa`, :func:`build_small_pair`.
- :mod:`.tofu_small_gate`: TOFU-small's sanity gate, checked before any benchmark number is trusted:
  :func:`small_gate`.
- :mod:`.precision`: whether bfloat16 autocast is native here (:func:`cpu_has_native_bf16`), which decides a
  recipe's ``bf16_autocast="auto"``.

TOFU-tiny (small Llama models trained from scratch on TOFU-shaped text) is the library's own demo subject,
:mod:`hf_unlearn.demo` (``build_tiny_pair``, ``load_tiny``).

Every name is re-exported here. A test patches a name where its caller looks it up: for a function called
inside this package that is its module (``pretrained.installed_gguf``), not this package.
"""

from __future__ import annotations

from .precision import (
    CPU_BF16_ENV,
    bf16_is_native,
    cpu_has_native_bf16,
    default_eval_autocast,
    resolve_bf16_autocast,
)
from .pretrained import (
    SUBJECTS,
    Subject,
    SubjectSpec,
    SubjectUnavailableError,
    dequantize_gguf,
    hub_offline,
    hub_reachable,
    installed_gguf,
    load_float32,
    resolve_subject,
)
from .tofu_small import (
    AUTHOR_ROWS,
    SMALL_FORGET_SPLIT,
    SmallPair,
    SmallRecipe,
    build_small_pair,
    fine_tune_qa,
    small_fine_tune_retain_rows,
    small_recipe_for,
    small_retain_validation_rows,
    small_tofu_configs,
    write_small_source,
)
from .tofu_small_gate import (
    GATE_REPORTS_FILE,
    SMALL_GATE_FQ_MAX,
    SMALL_GATE_ROUGE_MIN,
    SMALL_GATE_UTILITY_KEEP,
    gate_reports,
    general_component_ratios,
    small_gate,
    small_sanity_gate,
)

__all__ = [
    "AUTHOR_ROWS",
    "CPU_BF16_ENV",
    "GATE_REPORTS_FILE",
    "SMALL_FORGET_SPLIT",
    "SMALL_GATE_FQ_MAX",
    "SMALL_GATE_ROUGE_MIN",
    "SMALL_GATE_UTILITY_KEEP",
    "SUBJECTS",
    "SmallPair",
    "SmallRecipe",
    "Subject",
    "SubjectSpec",
    "SubjectUnavailableError",
    "build_small_pair",
    "cpu_has_native_bf16",
    "dequantize_gguf",
    "fine_tune_qa",
    "gate_reports",
    "general_component_ratios",
    "hub_offline",
    "hub_reachable",
    "installed_gguf",
    "load_float32",
    "resolve_bf16_autocast",
    "default_eval_autocast",
    "bf16_is_native",
    "resolve_subject",
    "small_fine_tune_retain_rows",
    "small_gate",
    "small_recipe_for",
    "small_retain_validation_rows",
    "small_sanity_gate",
    "small_tofu_configs",
    "write_small_source",
]
