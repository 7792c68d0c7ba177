"""The unlearning methods, one folder each.

Every method keeps its whole definition in ``hf_unlearn/methods/<name>/``:

``base/``       the trainer every gradient method shares (:class:`~hf_unlearn.methods.base.UnlearningTrainer`):
                ``config.py`` (``BaseUnlearningConfig``; ``UnlearningConfig``, the baseline objective's config),
                ``trainer.py``, ``pairing.py`` (forget/retain pairing and collation), ``guards.py`` (divergence
                guard, finite-weight checks and their errors), ``checkpoints.py`` (staged atomic checkpoints, run
                fingerprints), ``losses.py`` (the loss pieces every method shares)
``baselines/``  GradAscent, GradDiff, NPO, SimNPO, WGA, SatImp, CE-U, UNDIAL, DPO, IdkDPO: ``config.py`` (their
                configs), ``loss.py``, ``token_loss.py``, ``trainer.py``, ``token_trainer.py``, ``dpo.py``
``masc/``       MASC: ``config.py``, ``loss.py``, ``trainer.py`` (with its margin stopping rule)
``atwu/``       ATWU: ``config.py``, ``loss.py``, ``trainer.py``, ``weighter.py`` (the learned token weighter)
``rmu/``        RMU: ``config.py``, ``loss.py``, ``trainer.py`` (with its seeded control vector in checkpoints)
``pdu/``        PDU: ``config.py``, ``loss.py``, ``trainer.py`` (with its dual variable in checkpoints)
``grom/``       GROM, a closed-form edit: ``config.py``, ``solve.py`` (its objective and solution), ``model.py``
                (``fit_grom``, ``GROMEdit``), ...
``t3/``         T3, inference-time: ``config.py``, ``tilt.py`` (its formulas), ``fit.py``, ``processor.py``, ...

A ``loss.py`` holds pure tensor functions (formula in each docstring) that the method's trainer calls, so a test of
a loss function tests the formula the trainer trains. Each method's ``__init__`` registers the method once with
:mod:`hf_unlearn.registry` (``register_class``), from the class attributes its trainer or artifact carries
(``_method``, ``_title``, ``_paper``, ``_cli_help``); the command line, the model cards and the benchmark read
the registry.

Adding a method is one folder plus one registration: write ``methods/<name>/`` (a config subclassing
``BaseUnlearningConfig`` and a trainer subclassing ``UnlearningTrainer`` that overrides
``compute_unlearning_loss``, or a fit function and an artifact class), call ``register_class`` in its
``__init__``, and add the package to :data:`hf_unlearn.registry.BUILTIN_PACKAGES` (a method outside the package
registers itself when its module is imported).

This package imports nothing itself, so importing one method does not import the others.
"""
