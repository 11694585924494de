"""Issue 40's remaining bullets, one test (or a few) each, every one failing on the code before them:
noise a user cannot act on, progress of an evaluation, the check's word on tiny-agent, a static image of
a comparison and the components' legend, and a light training form."""

from __future__ import annotations

import io
import logging

# ---------------------------------------------------------------- 1. noise a user cannot act on


def _seen(logger_name: str, message: str) -> list[str]:
    """What a handler on ``logger_name`` receives of one warning (a logger's filters run before its handlers)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)  # the suite runs transformers at TRANSFORMERS_VERBOSITY=error
    try:
        logger.warning(message)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return stream.getvalue().splitlines()


def test_trl_none_reward_dump_is_silenced_other_warnings_kept(tiny_path):
    from grpo_magic.models import load_model
    from grpo_magic.trl_compat import quiet_library_logs

    quiet_library_logs(load_model(tiny_path))
    dump = ("All reward functions returned None for the following kwargs:\n{'prompt': 'secret row', "
            "'completion': 'x'}\nPlease ensure that at least one reward function returns a valid reward.")
    assert _seen("trl.trainer.grpo_trainer", dump) == []
    assert _seen("trl.trainer.grpo_trainer", "Something else TRL says") == ["Something else TRL says"]


def test_tied_head_missing_on_resume_is_silenced_only_for_a_tied_model(tiny_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_magic.models import load_model
    from grpo_magic.trl_compat import has_tied_head, quiet_library_logs

    tied = load_model(tiny_path)
    assert has_tied_head(tied)
    message = "There were missing keys in the checkpoint model loaded: ['lm_head.weight']."
    quiet_library_logs(tied)
    assert _seen("transformers.trainer", message) == []
    assert _seen("transformers.trainer", "There were unexpected keys in the checkpoint model loaded: ['x'].")
    config = AutoConfig.from_pretrained(tiny_path)
    config.tie_word_embeddings = False
    untied = AutoModelForCausalLM.from_config(config)
    assert not has_tied_head(untied)
    quiet_library_logs(untied)  # an untied head that is missing is a real fault: it stays loud
    assert _seen("transformers.trainer", message) == [message]


def test_build_trainer_installs_the_quiet_filters_and_ignores_trls_experimental_warning():
    import inspect

    from grpo_magic import trainer

    source = inspect.getsource(trainer.build_trainer)
    assert "quiet_library_logs(model)" in source
    assert "warnings.filterwarnings" not in inspect.getsource(trainer)  # wording filters live in trl_compat


def test_loading_bars_off_outside_a_terminal(tiny_path, capsys):
    from transformers.utils import logging as hf_logging

    from grpo_magic.models import load_model

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()  # as a user's session has it (the suite's conftest turns bars off)
    try:
        load_model(tiny_path)
        assert hf_logging.is_progress_bar_enabled()  # the user's setting is put back
    finally:
        if not was:
            hf_logging.disable_progress_bar()
    assert "Loading weights" not in capsys.readouterr().err
