"""Issue 40's remaining bullets, one test (or a few) each, every one failing on the code before them:
noise a user cannot act on, progress of an evaluation, the check's word on tiny-agent, a static image of
a comparison and the components' legend, and a light training form."""

from __future__ import annotations

import io
import logging

import pytest

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

    from grpo_magic.training import trainer

    source = inspect.getsource(trainer.build_trainer)
    assert "quiet_library_logs(model)" in source
    assert "warnings.filterwarnings" not in inspect.getsource(trainer)  # wording filters live in trl_compat


def test_loading_bars_off_outside_a_terminal(tiny_path, capsys):
    import warnings

    from transformers.utils import logging as hf_logging

    from grpo_magic.models import load_model

    was = hf_logging.is_progress_bar_enabled()
    with warnings.catch_warnings():  # the suite's HF_HUB_DISABLE_PROGRESS_BARS=1 says it wins over huggingface_hub's
        warnings.simplefilter("ignore", UserWarning)
        hf_logging.enable_progress_bar()  # as a user's session has it (the suite's conftest turns bars off)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            load_model(tiny_path)
        assert hf_logging.is_progress_bar_enabled()  # the user's setting is put back
    finally:
        if not was:
            hf_logging.disable_progress_bar()
    assert "Loading weights" not in capsys.readouterr().err


# ---------------------------------------------------------------- 2. progress of an evaluation

SLOWISH_ENV = '''
from datasets import Dataset


class CountEnv:
    """Ten held-out prompts; every score is 0.5."""

    def build_dataset(self, tokenizer):
        return Dataset.from_dict({"prompt": [f"Say {i}" for i in range(10)]})

    def build_eval_dataset(self, tokenizer):
        return self.build_dataset(tokenizer)

    def score_episode(self, model, tokenizer, completion, case_idx=None):
        return 0.5
'''


def test_cli_eval_says_its_progress_on_stderr_every_few_prompts(cli, tmp_path, tiny_path):
    (tmp_path / "count_env.py").write_text(SLOWISH_ENV)
    result = cli(["eval", "--model", "tiny", "--rl-env-module", "count_env", "--rl-env-class", "CountEnv",
                  "--greedy", "--rl-max-new-tokens", "2"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("grpo-magic eval:")]
    assert any("generating the greedy episodes of 10 prompts" in line for line in lines), result.stderr
    scored = [line.split("scored ")[1].split(" prompts")[0] for line in lines if "scored" in line]
    assert scored == ["4/10", "8/10", "10/10"], lines
    assert "grpo-magic eval:" not in result.stdout  # stdout stays the report


def test_notebook_eval_progress_is_one_line_that_updates(shell, tiny_path, monkeypatch):
    shell.run_cell_magic("grpo_env", "CountEnv", SLOWISH_ENV)
    published: list[tuple[dict, dict | None, bool]] = []
    original = shell.display_pub.publish

    def publish(data, metadata=None, *args, transient=None, update=False, **kwargs):
        if str(data.get("text/plain", "")).startswith("grpo-magic eval:"):
            published.append((data, transient, update))
        return original(data, metadata, *args, transient=transient, update=update, **kwargs)

    monkeypatch.setattr(shell.display_pub, "publish", publish)
    report = shell.run_line_magic("grpo_eval", "CountEnv --model tiny --greedy --rl-max-new-tokens 2")
    assert report.summary["prompts"] == 10
    assert len(published) >= 4, published
    ids = {transient["display_id"] for _, transient, _ in published}
    assert len(ids) == 1  # one line, updated in place
    assert [update for _, _, update in published] == [False] + [True] * (len(published) - 1)
    assert "scored 10/10 prompts" in published[-1][0]["text/plain"]


# ---------------------------------------------------------------- 3. the check's word on tiny-agent


class LookupEnv:
    """An agent env whose requests never name its tool: what a new user writes first."""

    def build_dataset(self, tokenizer=None):
        from datasets import Dataset

        words = ["apple", "river", "stone", "cloud"]
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What does {w} mean?"}] for w in words],
                                  "word": words})

    def reset(self, **row):
        pass

    def lookup(self, word: str) -> str:
        """Look a word up in the dictionary.

        Args:
            word: The word.
        """
        return f"{word}: a thing"

    def score_episode(self, model, tokenizer, completion, tool_calls, word):
        return 1.0 if tool_calls and tool_calls[0]["name"] == "lookup" else 0.0


def test_check_on_tiny_agent_says_what_it_can_call_when_no_prompt_names_the_tool():
    from grpo_magic import check_env

    report = check_env(LookupEnv, model="tiny-agent", samples=2, num_generations=2, max_new_tokens=32)
    assert report.agent["offered_call_share"] == 0
    why = [w for w in report.warnings if w.startswith("no episode called an offered tool")]
    assert len(why) == 1, report.warnings
    sentence = why[0]
    assert "tiny-agent only calls a tool whose name the request gives in quotes, each argument as `name value`" \
        in sentence
    assert "none of these prompts names 'lookup' in quotes" in sentence
    assert "README" in sentence and "try a model trained on tool calls" in sentence
    assert sentence.replace("e.g. ", "").count(". ") == 0 and sentence.endswith(".")  # one sentence


# ---------------------------------------------------------------- 4. a comparison's picture, the components' legend


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_compare_bundle_carries_a_png_with_a_legend_of_the_runs(tmp_path):
    import base64
    from array import array

    pytest.importorskip("anywidget")
    from grpo_magic import GRPOParams, compare
    from grpo_magic.dashboard.curves import Curves
    from grpo_magic.events import RunFinished, RunLog, RunStarted, StepLogged

    folders = []
    for i, lr in enumerate((1e-5, 1e-4)):
        folder = tmp_path / f"lr-{i}"
        params = GRPOParams(model="tiny", lr=lr, max_steps=5, project_name=str(folder)).to_dict()
        log = RunLog(folder)
        log(RunStarted(params=params, env_name="E", model="tiny", output_dir=str(folder), max_steps=5))
        for s in range(1, 6):
            log(StepLogged(step=s, metrics={"reward": 0.1 * s * (i + 1), "loss": 0.1}, max_steps=5))
        log(RunFinished(status="completed", steps=5))
        log.close()
        folders.append(folder)
    comparison = compare(*folders)
    bundle, _meta = comparison._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle and "lr differs" in bundle["text/plain"]
    width, height = _png_size(base64.b64decode(bundle["image/png"]))
    assert width > 400 and height > 100
    # the same panels the PNG draws: on the reward panel a legend names each run
    drawn = Curves(comparison.panels())
    rows = comparison.rows()
    metrics = {c: array("d", [float("nan") if v is None else v for v in vals]) for c, vals in rows["columns"].items()}
    drawn.png(array("d", rows["x"]), metrics, array("d"), array("d"), array("d"))
    legend = drawn.axes[0].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == comparison.names


def test_components_panel_picture_has_a_legend_naming_each_component():
    from array import array

    from grpo_magic.dashboard.curves import Curves
    from grpo_magic.dashboard.panels import components_panel

    for names in (("format", "answer"), ("answer",)):
        panel = components_panel(names)
        curves = Curves([panel])
        metrics = {s.metric: array("d", [0.1, 0.2, 0.3]) for s in panel.series}
        curves.png(array("d", [1, 2, 3]), metrics, array("d"), array("d"), array("d"))
        legend = curves.axes[0].get_legend()
        assert legend is not None, names
        assert [t.get_text() for t in legend.get_texts()] == list(names)


# ---------------------------------------------------------------- 5. a light training form


def _models_made_by(make) -> tuple[int, object]:
    import warnings

    import ipywidgets as w

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Widget.widgets: the registry, still the count
        before = set(w.Widget.widgets)
        made = make()
        return len(set(w.Widget.widgets) - before), made


def test_the_form_is_a_few_dozen_models_until_all_trl_settings_is_opened():
    from grpo_magic import GRPOParams
    from grpo_magic.frontends.form import TrainForm

    count, form = _models_made_by(lambda: TrainForm(GRPOParams(model="tiny", scale_rewards="none"), None))
    assert count < 100, count  # was 1,554: every TRL setting's widgets, layouts and styles
    assert form._trl_fields is None
    assert form.params().trl_settings == {"scale_rewards": "none"}  # the flag's value, kept while closed
    assert "--scale-rewards none" in form.params().to_command()
    form.fields["recipe"].value = "dapo"  # a recipe while closed: its TRL settings are the form's
    assert form.params().trl_settings.get("epsilon_high") == 0.28
    opened, _ = _models_made_by(lambda: setattr(form.trl_accordion, "selected_index", 0))
    assert opened > 500
    assert set(form.trl_fields) == set(GRPOParams.trl_fields())  # every setting reachable once opened
    assert form.trl_fields["scale_rewards"].value == "none" and form.trl_fields["epsilon_high"].value == "0.28"
    assert len(form.trl_box.children) == len(GRPOParams.trl_fields())
    form.trl_fields["num_iterations"].value = "2"
    assert form.params().trl_settings["num_iterations"] == 2 and "--num-iterations 2" in form.params().to_command()
