"""The ``%grpo_train`` parameter form, generated from ``GRPOParams`` field metadata.

One widget per field, in the metadata's sections, with the help text as a tooltip. Every change
re-validates the whole parameter set with the same checks as the API and the CLI, shows the
problems, disables Train while there are any, and keeps the equivalent ``grpo-magic train``
command current. Train starts a background run with exactly the form's values.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from typing import Any

from .env import registered_envs
from .errors import GRPOMagicError
from .params import GROUPS, GRPOParams

MODULE_CHOICE = "(module and class below)"


def module_name_for(env_name: str) -> str:
    """The module file name ``%grpo_export`` uses by default: ``HotelEnv`` gives ``hotel_env``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", env_name).lower().replace("__", "_")


def command_for(params: GRPOParams, env_name: str | None) -> str:
    """The ``grpo-magic train`` command for these params; a notebook env is named by its export module."""
    spec = registered_envs().get(env_name) if env_name else None
    if spec is not None:
        module = spec.module if spec.source == "module" else module_name_for(spec.name)
        cls_name = spec.attr_name
        config = params.rl_env_config if params.rl_env_config is not None else (
            json.dumps(spec.config) if spec.config else None)
        params = params.replace(rl_env_module=module, rl_env_class=cls_name, rl_env_config=config)
    return params.to_command()


class TrainForm:
    """The parameter form: widgets generated from metadata, live validation, command preview, Train."""

    def __init__(
        self,
        params: GRPOParams,
        env_name: str | None = None,
        *,
        start: Callable[[GRPOParams, str | None, Callable[[Any], None]], Any] | None = None,
    ) -> None:
        import ipywidgets as w

        self._w = w
        self._start = start
        self.run: Any = None
        self.fields: dict[str, Any] = {}
        self.errors: dict[str, Any] = {}
        envs = list(registered_envs())
        options = [*envs, MODULE_CHOICE]
        self.env = w.Dropdown(options=options, value=env_name if env_name in envs else options[0],
                              description="env", style={"description_width": "initial"})
        _set_tooltip(self.env, "A registered environment (%%grpo_env), or a module and class given below.")
        sections = []
        for group in GROUPS:
            rows = [self.env] if group == "Environment" else []
            for f in GRPOParams.fields():
                if f.metadata.get("group") != group:
                    continue
                widget = self._widget_for(f.name, getattr(params, f.name))
                self.fields[f.name] = widget
                self.errors[f.name] = w.HTML(layout=w.Layout(margin="0 0 0 8px"))
                rows.append(w.HBox([widget, self.errors[f.name]]))
            sections.append(w.VBox([w.HTML(f"<b>{group}</b>"), *rows], layout=w.Layout(margin="0 0 6px 0")))
        self.problems_html = w.HTML()
        self.command = w.Textarea(disabled=False, layout=w.Layout(width="100%", height="60px"),
                                  description="command", style={"description_width": "initial"})
        self.train_button = w.Button(description="Train", button_style="success", icon="play")
        self.train_button.on_click(self._on_train)
        self.status = w.HTML()
        self.output = w.Output()
        self.widget = w.VBox([
            w.HTML("<h3 style='margin:0'>GRPO training</h3>"), *sections, self.problems_html, self.command,
            w.HBox([self.train_button, self.status]), self.output,
        ])
        self.widget.add_class("grpo-train-form")
        for widget in [self.env, *self.fields.values()]:
            widget.observe(lambda _change: self.refresh(), names="value")
        self.refresh()

    def _widget_for(self, name: str, value: Any) -> Any:
        w = self._w
        meta = next(f for f in GRPOParams.fields() if f.name == name).metadata
        kind = GRPOParams.field_type(name)
        common = dict(description=name, style={"description_width": "initial"}, layout=w.Layout(width="auto"))
        if kind is bool:
            widget = w.Checkbox(value=bool(value), indent=False, **common)
        elif "choices" in meta:
            widget = w.Dropdown(options=list(meta["choices"]), value=value, **common)
        elif kind is int and not GRPOParams.is_optional(name):
            widget = w.IntText(value=value, continuous_update=True, **common)
        elif kind is float and not GRPOParams.is_optional(name):
            widget = w.FloatText(value=value, continuous_update=True, **common)
        else:  # strings, and optional numbers (empty means None)
            widget = w.Text(value="" if value is None else str(value), continuous_update=True,
                            placeholder=meta.get("placeholder", ""), **common)
        _set_tooltip(widget, meta.get("help", ""))
        return widget

    # ------------------------------------------------------------ reading the form

    @property
    def env_name(self) -> str | None:
        return None if self.env.value == MODULE_CHOICE else self.env.value

    def _value(self, name: str) -> Any:
        raw = self.fields[name].value
        if not isinstance(self.fields[name], self._w.Text):
            return raw
        text = raw.strip()
        if text == "":
            return None
        kind = GRPOParams.field_type(name)
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                return text  # validation names the bad value
        return text

    def params(self) -> GRPOParams:
        return GRPOParams(**{name: self._value(name) for name in self.fields})

    def problems(self) -> list[tuple[str, str]]:
        params = self.params()
        found = params.problems()
        if self.env_name is None and not (params.rl_env_module and params.rl_env_class):
            found.append(("rl_env_module", "Choose a registered env or give rl_env_module and rl_env_class."))
        return found

    def refresh(self) -> None:
        """Re-validate, show each problem beside its field, update the command and Train."""
        problems = self.problems()
        by_field = {name: msg for name, msg in reversed(problems)}
        with self.widget.hold_sync():
            for name, label in self.errors.items():
                msg = by_field.get(name)
                label.value = f"<span style='color:#b00020'>{html.escape(msg)}</span>" if msg else ""
            self.problems_html.value = "".join(
                f"<div class='grpo-form-problem' style='color:#b00020'>{html.escape(m)}</div>" for _, m in problems)
            self.train_button.disabled = bool(problems)
            if not problems:
                self.command.value = command_for(self.params(), self.env_name)

    # ------------------------------------------------------------ training

    def _on_train(self, _button: Any = None) -> None:
        problems = self.problems()
        if problems or self._start is None:
            return
        self.status.value = "starting..."

        def show(widget: Any) -> None:
            from IPython.display import display

            self.output.clear_output()
            with self.output:  # a click is handled on the kernel's main thread, where this is safe
                display(widget)

        try:
            self.run = self._start(self.params(), self.env_name, show)
        except GRPOMagicError as exc:
            self.status.value = f"<span style='color:#b00020'>{html.escape(str(exc))}</span>"
            return
        self.status.value = f"run started: {html.escape(str(getattr(self.run, 'output_dir', '')))}"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def _set_tooltip(widget: Any, text: str) -> None:
    # ipywidgets 8 renamed description_tooltip to tooltip; we support >=7.7.
    if "tooltip" in widget.trait_names():
        widget.tooltip = text
    else:  # pragma: no cover - ipywidgets 7
        widget.description_tooltip = text
