"""The ``%grpo_train`` parameter form, generated from ``GRPOParams`` field metadata.

One widget per field, in the metadata's sections, with the help text as a tooltip. Every change
re-validates the whole parameter set with the same checks as the API and the CLI, shows the
problems, disables Train while there are any, and keeps the equivalent ``grpo-magic train``
command current. Train starts a background run with exactly the form's values.

Every widget model is state a saved notebook keeps: the "All TRL settings" section (over a hundred
settings) is built when the user first opens it, layouts and styles are shared, and a field's error
label is made when it first has a problem, so that the form starts at under a hundred models.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from typing import Any

from grpo_magic.config.memory import CARDS
from grpo_magic.config.params import GROUPS, GRPOParams
from grpo_magic.environment.env import registered_envs
from grpo_magic.errors import GRPOMagicError

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
        # A field's error label is made when it first has a problem to show (``_error_label``); layouts and
        # styles are shared: each is a widget model of its own in the notebook's state.
        self.errors: dict[str, Any] = {}
        self._sections: dict[Any, Any] = {}  # a field's widget -> the section it is in
        self._shared: dict[Any, Any] = {}
        envs = list(registered_envs())
        options = [*envs, MODULE_CHOICE]
        plain = self._shared_model(w.Layout)  # the default layout, one model for the widgets that keep it
        self.env = w.Dropdown(options=options, value=env_name if env_name in envs else options[0], layout=plain,
                              description="env", style=self._shared_model(w.Dropdown.style.klass,
                                                                          description_width="initial"))
        _set_tooltip(self.env, "A registered environment (%%grpo_env), or a module and class given below.")
        sections = []
        for group in GROUPS:
            rows = [self.env] if group == "Environment" else []
            for f in GRPOParams.fields():
                if f.metadata.get("group") != group:
                    continue
                widget = self._widget_for(f.name, getattr(params, f.name))
                self.fields[f.name] = widget
                rows.append(widget)
            title = w.HTML(f"<b>{group}</b>", layout=self._shared_model(w.Layout),
                           style=self._shared_model(w.HTML.style.klass))
            section = w.VBox([title, *rows], layout=self._shared_model(w.Layout, margin="0 0 6px 0"))
            self._sections.update(dict.fromkeys((row for row in rows if row is not self.env), section))
            sections.append(section)
        # "All TRL settings" (over a hundred settings, some 1,200 widget models) is built when first opened:
        # until then the form is a few hundred models and a saved notebook stays small (_open_trl).
        self._trl_fields: dict[str, Any] | None = None
        self._trl_pending: dict[str, Any] = dict(params.trl_settings)  # the TRL settings while not built
        self.trl_rows: dict[str, Any] = {}
        sections.append(self._trl_section())
        self._applying_recipe = False
        html_style = self._shared_model(w.HTML.style.klass)
        self.card = w.Dropdown(options=["this GPU", *CARDS], value="this GPU", description="will it fit on",
                               layout=plain, style=self._shared_model(w.Dropdown.style.klass,
                                                                      description_width="initial"))
        self.fit_button = w.Button(description="estimate memory", icon="calculator", layout=plain)
        self.fit_html = w.HTML(layout=plain, style=html_style)
        self.fit_button.on_click(lambda _b: self.show_estimate())
        sections.append(w.HBox([self.card, self.fit_button, self.fit_html], layout=plain))
        self.problems_html = w.HTML(layout=plain, style=html_style)
        self.command = w.Textarea(disabled=False, layout=w.Layout(width="100%", height="60px"),
                                  description="command", style={"description_width": "initial"})
        self.train_button = w.Button(description="Train", button_style="success", icon="play", layout=plain)
        self.train_button.on_click(self._on_train)
        self.status = w.HTML(layout=plain, style=html_style)
        self.output = w.Output(layout=plain)
        self.widget = w.VBox([
            w.HTML("<h3 style='margin:0'>GRPO training</h3>", layout=plain, style=html_style), *sections,
            self.problems_html, self.command, w.HBox([self.train_button, self.status], layout=plain), self.output,
        ], layout=plain)
        self.widget.add_class("grpo-train-form")
        for widget in [self.env, *self.fields.values()]:
            widget.observe(lambda _change: self.refresh(), names="value")
        self.fields["recipe"].observe(self._on_recipe, names="value")
        self.refresh()

    # ------------------------------------------------------------ All TRL settings

    def _trl_section(self) -> Any:
        """The "All TRL settings" section, closed: an accordion whose contents are built when first opened."""
        w = self._w
        count = len(GRPOParams.trl_fields())
        self._trl_holder = w.VBox(layout=self._shared_model(w.Layout))
        self.trl_accordion = w.Accordion(children=[self._trl_holder], selected_index=None,
                                         layout=self._shared_model(w.Layout))
        self.trl_accordion.set_title(0, f"All TRL settings ({count}: GRPOConfig of the installed TRL)")
        self.trl_accordion.observe(lambda change: change["new"] is not None and self._open_trl(), names="selected_index")
        return self.trl_accordion

    def _open_trl(self) -> dict[str, Any]:
        """Build every other GRPOConfig setting of the installed TRL, with TRL's help; searchable, set ones first.

        Built once, when the user opens the section (or code reads ``trl_fields``), from the values the form
        holds then (the flags', a recipe's)."""
        if self._trl_fields is not None:
            return self._trl_fields
        w = self._w
        fields: dict[str, Any] = {}
        for name, setting in GRPOParams.trl_fields().items():
            widget = self._trl_widget(setting, self._trl_pending.get(name))
            fields[name] = widget
            help_line = w.HTML(f"<span style='color:#666;font-size:85%'>{html.escape(setting.help[:160])}"
                               f"{'…' if len(setting.help) > 160 else ''}</span>",
                               layout=w.Layout(margin="0 0 0 8px"))
            row = w.HBox([widget, help_line])
            row.add_class("grpo-trl-setting")
            self.trl_rows[name] = row
        self._trl_fields = fields
        self._trl_search = w.Text(placeholder="search TRL's settings (name or help text)", description="search",
                                  continuous_update=True, style={"description_width": "initial"},
                                  layout=w.Layout(width="50%"))
        self._trl_search.observe(lambda _change: self._arrange_trl(), names="value")
        self._trl_box = w.VBox(layout=w.Layout(max_height="320px", overflow="auto"))
        self._arrange_trl()
        note = w.HTML("<span style='color:#666'>empty means TRL's default; the ones you set come first</span>")
        self._trl_holder.children = [note, self._trl_search, self._trl_box]
        for widget in fields.values():
            widget.observe(lambda _change: self.refresh(), names="value")
        return fields

    @property
    def trl_fields(self) -> dict[str, Any]:
        """The widgets of "All TRL settings", by setting name (built now if the section was never opened)."""
        return self._open_trl()

    @property
    def trl_search(self) -> Any:
        self._open_trl()
        return self._trl_search

    @property
    def trl_box(self) -> Any:
        self._open_trl()
        return self._trl_box

    def _trl_widget(self, setting: Any, value: Any) -> Any:
        w = self._w
        common = dict(description=setting.name, style={"description_width": "initial"}, layout=w.Layout(width="auto"))
        from grpo_magic.config.trl_settings import AUTO

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
        """Filter by the search words; the settings given a value first (nothing to arrange while closed)."""
        if self._trl_fields is None:
            return
        words = self._trl_search.value.lower().split()
        settings = GRPOParams.trl_fields()
        shown = [name for name in self._trl_fields
                 if all(word in f"{name} {settings[name].help}".lower() for word in words)]
        shown.sort(key=lambda name: self._trl_value(name) is None)  # stable: TRL's order within each part
        self._trl_box.children = [self.trl_rows[name] for name in shown]

    def _trl_value(self, name: str) -> Any:
        assert self._trl_fields is not None
        return self._read(self._trl_fields[name], lambda: GRPOParams.trl_fields()[name].kind)

    def trl_settings(self) -> dict[str, Any]:
        """The TRL settings given a value: the section's widgets once built, before that the form's own copy."""
        if self._trl_fields is None:
            return {name: value for name, value in self._trl_pending.items() if value is not None}
        return {name: value for name in self._trl_fields if (value := self._trl_value(name)) is not None}

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
            self._trl_pending = dict(new.trl_settings)
            for name, widget in (self._trl_fields or {}).items():
                value = new.trl_settings.get(name)
                if isinstance(widget, self._w.Text):
                    widget.value = "" if value is None else str(value)
                else:
                    widget.value = value
        self._arrange_trl()

    def _shared_model(self, cls: type, **traits: Any) -> Any:
        """One layout or style model of these traits for every widget that uses it (fewer models to save)."""
        key = (cls, tuple(sorted(traits.items())))
        if key not in self._shared:
            self._shared[key] = cls(**traits)
        return self._shared[key]

    def _error_label(self, name: str) -> Any:
        """The label beside a field that shows its problem, made the first time it is needed: the field's
        widget is then put in a row with it, in the same place of its section."""
        if name not in self.errors:
            w = self._w
            widget = self.fields[name]
            label = w.HTML(layout=self._shared_model(w.Layout, margin="0 0 0 8px"),
                           style=self._shared_model(w.HTML.style.klass))
            section = self._sections[widget]
            section.children = [w.HBox([widget, label], layout=self._shared_model(w.Layout)) if c is widget else c
                                for c in section.children]
            self.errors[name] = label
        return self.errors[name]

    def _widget_for(self, name: str, value: Any) -> Any:
        w = self._w
        meta = next(f for f in GRPOParams.fields() if f.name == name).metadata
        kind = GRPOParams.field_type(name)
        layout = self._shared_model(w.Layout, width="auto")

        def common(cls: type) -> dict[str, Any]:
            return dict(description=name, layout=layout,
                        style=self._shared_model(cls.style.klass, description_width="initial"))

        if kind is bool:
            widget = w.Checkbox(value=bool(value), indent=False, **common(w.Checkbox))
        elif "choices" in meta or meta.get("trl_choices"):
            choices = list(meta.get("choices") or GRPOParams.trl_choices(name))
            options = [("(none)", None), *[(c, c) for c in choices]] if GRPOParams.is_optional(name) else choices
            widget = w.Dropdown(options=options, value=value, **common(w.Dropdown))
        elif kind is int and not GRPOParams.is_optional(name):
            widget = w.IntText(value=value, continuous_update=True, **common(w.IntText))
        elif kind is float and not GRPOParams.is_optional(name):
            widget = w.FloatText(value=value, continuous_update=True, **common(w.FloatText))
        else:  # strings, and optional numbers (empty means None)
            widget = w.Text(value="" if value is None else str(value), continuous_update=True,
                            placeholder=meta.get("placeholder", ""), **common(w.Text))
        _set_tooltip(widget, meta.get("help", ""))
        return widget

    # ------------------------------------------------------------ reading the form

    @property
    def env_name(self) -> str | None:
        return None if self.env.value == MODULE_CHOICE else self.env.value

    def _value(self, name: str) -> Any:
        return self._read(self.fields[name], lambda: GRPOParams.field_type(name))

    def _read(self, widget: Any, kind: Callable[[], Any]) -> Any:
        """A widget's value; a text box's stripped text, empty as None, as an int or float where the field is one
        (``kind()``, asked only for text boxes); text that is no number is kept for validation to name."""
        if not isinstance(widget, self._w.Text):
            return widget.value
        text = widget.value.strip()
        if text == "":
            return None
        number = kind()
        if number in (int, float):
            try:
                return number(text)
            except ValueError:
                return text
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
            for name in self.fields:
                msg = by_field.get(name)
                if msg or name in self.errors:
                    label = self._error_label(name)
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
        from grpo_magic.config.memory import estimate

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
