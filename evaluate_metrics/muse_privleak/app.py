"""Gradio app of the muse_privleak metric when this folder is published as a Hugging Face Space."""

from pathlib import Path

import evaluate
from evaluate.utils import launch_gradio_widget

module = evaluate.load(str(Path(__file__).resolve().parent))
launch_gradio_widget(module)
