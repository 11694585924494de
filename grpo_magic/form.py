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
from .memory import CARDS
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
        self.trl_fields: dict[str, Any] = {}
        self.trl_rows: dict[str, Any] = {}
        sections.append(self._trl_section(params))
        self._applying_recipe = False
        self.card = w.Dropdown(options=["this GPU", *CARDS], value="this GPU", description="will it fit on",
                               style={"description_width": "initial"})
        self.fit_button = w.Button(description="estimate memory", icon="calculator")
        self.fit_html = w.HTML()
        self.fit_button.on_click(lambda _b: self.show_estimate())
        sections.append(w.HBox([self.card, self.fit_button, self.fit_html]))
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
        for widget in [self.env, *self.fields.values(), *self.trl_fields.values()]:
            widget.observe(lambda _change: self.refresh(), names="value")
        self.fields["recipe"].observe(self._on_recipe, names="value")
        self.refresh()

    # ------------------------------------------------------------ All TRL settings

    def _trl_section(self, params: GRPOParams) -> Any:
        """Every other GRPOConfig setting of the installed TRL, with TRL's help; searchable, the set ones first."""
        w = self._w
        for name, setting in GRPOParams.trl_fields().items():
            widget = self._trl_widget(setting, params.trl_settings.get(name))
            self.trl_fields[name] = widget
            help_line = w.HTML(f"<span style='color:#666;font-size:85%'>{html.escape(setting.help[:160])}"
                               f"{'…' if len(setting.help) > 160 else ''}</span>",
                               layout=w.Layout(margin="0 0 0 8px"))
            row = w.HBox([widget, help_line])
            row.add_class("grpo-trl-setting")
            self.trl_rows[name] = row
        self.trl_search = w.Text(placeholder="search TRL's settings (name or help text)", description="search",
                                 continuous_update=True, style={"description_width": "initial"},
                                 layout=w.Layout(width="50%"))
        self.trl_search.observe(lambda _change: self._arrange_trl(), names="value")
        self.trl_box = w.VBox(layout=w.Layout(max_height="320px", overflow="auto"))
        self._arrange_trl()
        title = w.HTML("<b>All TRL settings</b> <span style='color:#666'>(GRPOConfig of the installed TRL; "
                       "empty means TRL's default; the ones you set come first)</span>")
        return w.VBox([title, self.trl_search, self.trl_box], layout=w.Layout(margin="0 0 6px 0"))

    def _trl_widget(self, setting: Any, value: Any) -> Any:
        w = self._w
        common = dict(description=setting.name, style={"description_width": "initial"}, layout=w.Layout(width="auto"))
        from .trl_settings import AUTO

        default = "chosen for the device" if setting.name in AUTO else repr(setting.default)
        if setting.kind is bool or setting.choices:
            values = [True, False] if setting.kind is bool else list(setting.choices)
            options = [(f"(TRL default: {default})", None), *[(str(v), v) for v in values]]
            widget = w.Dropdown(options=options, value=value if value in values else None, **common)
        else:
            text = "" if value is None else (json.dumps(value) if isinstance(value, (dict, list)) else str(value))
            widget = w.Text(value=text, placeholder=f"TRL default: {default}", continuous_update=True, **common)
        _set_tooltip(widget, setting.help)
        return widget

    def _arrange_trl(self) -> None:
        """Filter by the search words; the settings given a value first."""
        words = self.trl_search.value.lower().split()
        settings = GRPOParams.trl_fields()
        shown = [name for name in self.trl_fields
                 if all(word in f"{name} {settings[name].help}".lower() for word in words)]
        shown.sort(key=lambda name: self._trl_value(name) is None)  # stable: TRL's order within each part
        self.trl_box.children = [self.trl_rows[name] for name in shown]

    def _trl_value(self, name: str) -> Any:
        widget = self.trl_fields[name]
        if not isinstance(widget, self._w.Text):
            return widget.value
        text = widget.value.strip()
        if text == "":
            return None
        kind = GRPOParams.trl_fields()[name].kind
        if kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                return text  # validation names the bad value
        return text

    def trl_settings(self) -> dict[str, Any]:
        return {name: value for name in self.trl_fields if (value := self._trl_value(name)) is not None}

    def _on_recipe(self, change: Any) -> None:
        """A recipe chosen: show its settings in the widgets, except those the user set (they win)."""
        if self._applying_recipe:
            return
        self._applying_recipe = True
        try:
            old = GRPOParams(**{n: self._value(n) for n in self.fields if n != "recipe"}, recipe=change["old"] or None,
                             trl_settings=self.trl_settings())
            new = old.replace(recipe=change["new"] or None)
        except GRPOMagicError:
            return  # the form shows the problem
        finally:
            self._applying_recipe = False
        with self.widget.hold_sync():
            for name, widget in self.fields.items():
                value = getattr(new, name)
                widget.value = ("" if value is None else str(value)) if isinstance(widget, self._w.Text) else value
            for name, widget in self.trl_fields.items():
                value = new.trl_settings.get(name)
                if isinstance(widget, self._w.Text):
                    widget.value = "" if value is None else str(value)
                else:
                    widget.value = value
        self._arrange_trl()

    def _widget_for(self, name: str, value: Any) -> Any:
        w = self._w
        meta = next(f for f in GRPOParams.fields() if f.name == name).metadata
        kind = GRPOParams.field_type(name)
        common = dict(description=name, style={"description_width": "initial"}, layout=w.Layout(width="auto"))
        if kind is bool:
            widget = w.Checkbox(value=bool(value), indent=False, **common)
        elif "choices" in meta or meta.get("trl_choices"):
            choices = list(meta.get("choices") or GRPOParams.trl_choices(name))
            options = [("(none)", None), *[(c, c) for c in choices]] if GRPOParams.is_optional(name) else choices
            widget = w.Dropdown(options=options, value=value, **common)
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
        return GRPOParams(**{name: self._value(name) for name in self.fields}, trl_settings=self.trl_settings())

    def problems(self) -> list[tuple[str, str]]:
        params = self.params()
        found = params.problems()
        if self.env_name is None and not (params.rl_env_module and params.rl_env_class):
            found.append(("rl_env_module", "Choose a registered env or give rl_env_module and rl_env_class."))
        return found

    def refresh(self) -> None:
        """Re-validate, show each problem beside its field, update the command and Train."""
        try:
            problems = self.problems()
        except GRPOMagicError as exc:  # a setting given twice, say: one sentence, as the API words it
            problems = [("trl_settings", str(exc))]
        by_field = {name: msg for name, msg in reversed(problems)}
        with self.widget.hold_sync():
            for name, label in self.errors.items():
                msg = by_field.get(name)
                if name == "trl_settings":
                    continue
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

    def show_estimate(self) -> None:
        """The "will it fit" estimate of the form's values (memory.py): weights, gradients, optimizer, activations."""
        from .memory import estimate

        try:
            card = None if self.card.value == "this GPU" else self.card.value
            self.fit_html.value = estimate(self.params(), card=card).html()
        except Exception as exc:  # noqa: BLE001 - a model whose config cannot be read: say so, beside the button
            self.fit_html.value = f"<span style='color:#b00020'>{html.escape(str(exc))}</span>"

    def __str__(self) -> str:
        """The form in words, for IPython in a terminal (no widgets there): its problems, or the command."""
        try:
            problems = [m for _, m in self.problems()]
        except GRPOMagicError as exc:
            problems = [str(exc)]
        lines = [f"GRPO training form: env {self.env_name or '(module)'}"]
        lines += [f"  ! {m}" for m in problems] or [f"  {command_for(self.params(), self.env_name)}"]
        lines.append("  (widgets need Jupyter; in a terminal, add --run to the %grpo_train line to train)")
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _ipython_display_(self) -> None:
        from IPython.display import display

        bundle = dict(self.widget._repr_mimebundle_() or {})
        bundle["text/plain"] = str(self)  # what a front end without widgets (IPython in a terminal) shows
        display(bundle, raw=True)


def _set_tooltip(widget: Any, text: str) -> None:
    # ipywidgets 8 renamed description_tooltip to tooltip; we support >=7.7.
    if "tooltip" in widget.trait_names():
        widget.tooltip = text
    else:  # pragma: no cover - ipywidgets 7
        widget.description_tooltip = text
