"""Metric Spaces: :func:`push_metric_space` publishes an ``evaluate_metrics/<name>`` module as a Gradio Space so
``evaluate.load("<owner>/<name>")`` loads it from that Hub."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..assets import metric_path
from .push import _check_repo_id, _resolve_token, push_folder


def push_metric_space(
    name: str, repo_id: str, token: str | None = None, private: bool | None = None, *,
    commit_message: str | None = None, endpoint: str | None = None,
):
    """Publish the ``evaluate_metrics/<name>`` module as a Gradio Space, in one commit.

    The Space's name must be the metric's name: ``evaluate.load("<owner>/<name>")`` downloads
    ``<name>.py`` from the Space ``<owner>/<name>``. Returns the ``huggingface_hub.CommitInfo``.
    """
    source = Path(metric_path(name))
    _check_repo_id(repo_id)
    if "/" not in repo_id or repo_id.split("/")[1] != name:
        raise ValueError(
            f"A metric Space must be named '<owner>/{name}' so evaluate.load('<owner>/{name}') finds "
            f"{name}.py; got {repo_id!r}."
        )
    token = _resolve_token(token)
    from huggingface_hub import RepoCard

    with tempfile.TemporaryDirectory(prefix="hf-unlearn-space-") as tmp:
        folder = Path(tmp)
        for path in source.iterdir():
            if path.is_file() and path.suffix not in (".pyc",):
                shutil.copy2(path, folder / path.name)
        if not (folder / "app.py").is_file():
            (folder / "app.py").write_text(
                "import evaluate\nfrom evaluate.utils import launch_gradio_widget\n\n"
                f"module = evaluate.load({repo_id!r})\nlaunch_gradio_widget(module)\n"
            )
        readme = folder / "README.md"
        card = RepoCard(readme.read_text(encoding="utf-8")) if readme.is_file() else RepoCard("---\n---\n")
        for key, value in (("sdk", "gradio"), ("app_file", "app.py")):
            if getattr(card.data, key, None) is None:
                card.data[key] = value
        card.data["tags"] = list(dict.fromkeys([*(card.data.get("tags") or []), "evaluate", "metric"]))
        card.save(str(readme))
        return push_folder(
            folder, repo_id, token=token, repo_type="space", private=private, space_sdk="gradio",
            commit_message=commit_message or f"Upload the {name} metric", endpoint=endpoint,
        )
