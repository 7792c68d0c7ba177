"""The unlearning methods, one folder each.

Every method keeps its whole definition in ``hf_unlearn/methods/<name>/``:

``base/``       the trainer every gradient method shares (:class:`~hf_unlearn.methods.base.UnlearningTrainer`):
                ``config.py`` (``BaseUnlearningConfig``; ``UnlearningConfig``, the baseline objective's config),
                ``trainer.py`` (no objective of its own), ``inputs.py`` (checks before any work),
                ``reference.py`` (the frozen reference model), ``metrics.py`` (logged values), ``pairing.py``
                (forget/retain pairing and collation), ``guards.py`` (divergence guard, finite-weight checks and
                their errors), ``checkpoints.py`` (staged atomic checkpoints, run fingerprints), ``saving.py``
                (the final model, its card, the push), ``losses.py`` (the loss pieces every method shares)
``baselines/``  GradAscent, GradDiff, NPO, SimNPO, WGA, SatImp, CE-U, UNDIAL, DPO, IdkDPO: ``config.py`` (their
                configs), ``loss.py``, ``token_loss.py``, ``trainer.py``, ``token_trainer.py``, ``dpo.py``
``masc/``       MASC: ``config.py``, ``loss.py``, ``trainer.py``, ``stopping.py`` (its margin stopping rule)
``atwu/``       ATWU: ``config.py``, ``loss.py``, ``trainer.py``, ``weighter.py`` (the learned token weighter)
``rmu/``        RMU: ``config.py``, ``loss.py``, ``trainer.py`` (with its seeded control vector in checkpoints)
``pdu/``        PDU: ``config.py``, ``loss.py``, ``trainer.py`` (with its dual variable in checkpoints)
``grom/``       GROM, a closed-form edit: ``config.py``, ``solve.py`` (its objective and solution), ``fit.py``
                (``fit_grom``), ``edit.py`` (``GROMEdit``), ...
``t3/``         T3, inference-time: ``config.py``, ``tilt.py`` (its formulas), ``fit.py``, ``cache.py``,
                ``head_training.py``, ``processor.py``, ...

A ``loss.py`` holds pure tensor functions (formula in each docstring) that the method's trainer calls. Each
method's ``__init__`` registers it once with :func:`hf_unlearn.registry.register_method` and its classes: its config
and its trainer (``trainer_cls=``), or its config and its fit (``fit=``, a
:class:`~hf_unlearn.registry.MethodFit`). Adding a built-in method is one folder, that registration, and its
package in :data:`BUILTIN_PACKAGES`; a method outside the package registers itself when its module is imported.
No module outside these folders names a method.

This package imports nothing itself, so importing one method does not import the others.
"""

#: The built-in method folders, imported by the registry's first lookup; their order is the order of
#: :func:`hf_unlearn.registry.method_names`.
BUILTIN_PACKAGES = (
    "hf_unlearn.methods.grom", "hf_unlearn.methods.t3", "hf_unlearn.methods.masc", "hf_unlearn.methods.atwu",
    "hf_unlearn.methods.baselines", "hf_unlearn.methods.rmu", "hf_unlearn.methods.pdu",
)
