"""The unlearning methods, one folder each (``base/`` holds the trainer every gradient method shares).

A method's ``loss.py`` holds pure tensor functions (formula in each docstring) that its trainer calls; its
``__init__`` registers it once with :func:`hf_unlearn.registry.register_method`: its config and its trainer
(``trainer_cls=``) or its fit (``fit=``). Adding a built-in method is one folder, that registration, and its
package in :data:`BUILTIN_PACKAGES`. No module outside these folders names a method, and this package imports
nothing itself.
"""

#: The built-in method folders, imported by the registry's first lookup; their order is the order of
#: :func:`hf_unlearn.registry.method_names`.
BUILTIN_PACKAGES = (
    "hf_unlearn.methods.grom", "hf_unlearn.methods.t3", "hf_unlearn.methods.masc", "hf_unlearn.methods.atwu",
    "hf_unlearn.methods.baselines", "hf_unlearn.methods.rmu", "hf_unlearn.methods.pdu",
)
