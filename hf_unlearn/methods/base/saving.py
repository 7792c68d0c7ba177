"""Saving an unlearning run's model: the final model built in a temporary sibling folder and swapped in
(:func:`hf_unlearn.safe_output.atomic_directory`), its model card, and the push of the run folder in one commit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...safe_output import OutputWriteError, atomic_directory, check_output_dir
from .checkpoints import RUN_ENTRIES

__all__ = ["SavingMixin"]


class SavingMixin:
    """The model saving of :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer` (a ``Trainer``)."""

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (weights, config, tokenizer) to ``output_dir`` (default ``args.output_dir``) safely.

        The trainable weights are checked finite first. The model is written in a temporary sibling folder and
        swapped in only when completely written; the run's checkpoints in ``args.output_dir`` are kept. A target
        other than ``args.output_dir`` (or ``args.output_dir`` before :meth:`train` claimed it) is checked like
        the output folder (not the model folder, empty unless ``overwrite=True``). A failed write (full disk,
        read-only folder) raises a one-line :class:`~hf_unlearn.safe_output.OutputWriteError` and leaves the
        previous content as it was. Inside a checkpoint, and under FSDP / DeepSpeed (which write from every
        process), transformers writes in place."""
        if self._staging_dir is not None or self.is_fsdp_enabled or self.is_deepspeed_enabled:
            return super().save_model(output_dir, _internal_call)
        self._check_finite_weights("the model")
        if not self.args.should_save:  # the main process checks and writes; DDP's others write nothing
            return super().save_model(output_dir, _internal_call=True)
        out = Path(output_dir if output_dir is not None else self.args.output_dir)
        run_dir = Path(self.args.output_dir).expanduser().resolve()
        is_run_dir = out.expanduser().resolve() == run_dir
        claimed = is_run_dir and self._run_dir_claimed
        check_output_dir(out, self._input_dirs, overwrite=claimed or bool(getattr(self.args, "overwrite", False)))
        try:
            with atomic_directory(out, overwrite=True, keep=RUN_ENTRIES if is_run_dir else ()) as tmp:
                super().save_model(str(tmp), _internal_call=True)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).replace("\n", " ")
            raise OutputWriteError(
                f"Could not write the model to {out}: {reason}. The previous content of {out} is unchanged."
            ) from exc
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, report: Any = None, forget_split: str | None = None):
        """Write ``README.md``: the method, its paper and settings, and the evaluator's ``report`` (a dict or JSON
        path, e.g. ``trainer.push_to_hub(report=...)``) as ``model-index`` (:func:`hf_unlearn.hub.trainer_model_card`)."""
        if not self.is_world_process_zero():
            return
        from ...hub import trainer_model_card
        from ...safe_output import atomic_write_text

        card = trainer_model_card(self, model_name, dataset_name, tags, report=report, forget_split=forget_split)
        atomic_write_text(Path(self.args.output_dir) / "README.md", str(card))

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> Any:
        """Save the model, write its card (``kwargs``, e.g. ``report=``, go to :meth:`create_model_card`) and upload
        ``args.output_dir`` (without ``checkpoint-*`` and ``_*`` entries) to ``args.hub_model_id`` in one commit
        with :func:`hf_unlearn.hub.push.push_folder`. The steps and arguments are transformers'
        ``Trainer.push_to_hub``'s; returns the ``CommitInfo`` (a future of it when not ``blocking``)."""
        from ...hub.push import push_folder

        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        model_name = kwargs.pop("model_name", None)
        if model_name is None and self.args.should_save:
            hub_id = self.args.hub_model_id
            model_name = Path(self.args.output_dir).name if hub_id is None else hub_id.split("/")[-1]
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)  # every process (TPU); only args.should_save writes
        if not self.is_world_process_zero():
            return None
        model_tags = getattr(self.model, "model_tags", None)
        if model_tags is not None:
            tags = kwargs.get("tags") or []
            tags = [tags] if isinstance(tags, str) else list(tags)
            kwargs["tags"] = tags + [t for t in model_tags if t not in tags]
        self.create_model_card(model_name=model_name, **kwargs)
        self._finish_current_push()
        return push_folder(
            self.args.output_dir, self.hub_model_id, token=token, private=private,
            revision=revision if revision is not None else self.args.hub_revision,
            commit_message=commit_message or "End of training",
            ignore_patterns=("_*", f"{PREFIX_CHECKPOINT_DIR}-*"), run_as_future=not blocking,
        )
