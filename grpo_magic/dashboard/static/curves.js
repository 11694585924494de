// The live curves of a grpo_magic run, drawn in the page with uPlot (grpo_magic/dashboard/live.py).
//
// Python sends what is new (custom widget messages): "reset" (every row so far), "append" (rows from
// `start` on: the last row held is sent again, as TRL may log a step twice) and "overlay" (markers,
// evaluations). A marker is [step, label] (grey, dashed: an env swap) or [step, label, "alarm"] (red, solid:
// the reward-hacking watch fired; its label is written on the reward panel). The page keeps the series and draws them; nothing waits for it in the kernel. The
// panels, notes and header text come as synced traits (`spec`, `notes`, `caption`), so a page opened
// later asks for the rows with "hello". A click on the reward curve sends {kind: "select", step}.
// (uPlot is prepended to this file by live.py, as the global `uPlot`.)

const FAINT = 0.28;

function alpha(color, a) {
  const n = parseInt(color.slice(1), 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
}

function fmt(v) {
  if (v == null || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (a >= 1e3) return (v / 1e3).toFixed(1) + "k";
  if (a >= 1e-2) return String(+v.toPrecision(3));
  if (a >= 1e-3) return String(+v.toPrecision(2));
  return v.toExponential(1);
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "grpo-chart";
  root.dataset.points = "0";
  root.dataset.step = "0";
  el.appendChild(root);
  const bar = document.createElement("div");
  bar.className = "grpo-chart-bar";
  bar.innerHTML =
    '<span class="grpo-caption"></span>' +
    '<label title="exponential moving average of each curve; the raw points stay faint">smoothing ' +
    '<input class="grpo-smoothing" type="range" min="0" max="0.99" step="0.01"> <span class="grpo-smoothing-value"></span></label>' +
    '<span class="grpo-hint">drag: zoom · double click: reset · legend: show/hide · click the reward curve: its groups</span>';
  root.appendChild(bar);
  const grid = document.createElement("div");
  grid.className = "grpo-grid";
  root.appendChild(grid);
  const slider = bar.querySelector(".grpo-smoothing");
  const sliderValue = bar.querySelector(".grpo-smoothing-value");

  // The data the page keeps: x (steps) and one array per column, plus the overlays.
  const st = { x: [], cols: {}, markers: [], evals: [], smooth: {}, panels: [], drawTimes: [], gaps: 0 };
  root._grpo = st; // for tests and curious users: what the page holds and how long drawing took

  function weight() {
    return Math.min(0.99, Math.max(0, +model.get("smoothing") || 0));
  }

  // EMA with TensorBoard's debiasing, kept per column: acc/cnt let an append resume at `start`.
  function smoothFrom(name, start) {
    const raw = st.cols[name];
    let s = st.smooth[name];
    if (!s) s = st.smooth[name] = { acc: [], cnt: [], out: [] };
    const w = weight();
    s.acc.length = s.cnt.length = s.out.length = start;
    let acc = start > 0 ? s.acc[start - 1] : 0;
    let cnt = start > 0 ? s.cnt[start - 1] : 0;
    for (let i = start; i < raw.length; i++) {
      const v = raw[i];
      if (v != null && Number.isFinite(v)) {
        acc = w * acc + (1 - w) * v;
        cnt += 1;
      }
      s.acc.push(acc);
      s.cnt.push(cnt);
      s.out.push(v == null || !Number.isFinite(v) ? null : w > 0 ? acc / (1 - Math.pow(w, cnt)) : v);
    }
    return s.out;
  }

  function derived(panel, start) {
    // the ± std band of a panel's first series
    if (!panel.band) return;
    const c = st.cols[panel.series[0].col] || [];
    const d = st.cols[panel.band] || [];
    const hi = (panel._hi = panel._hi || []);
    const lo = (panel._lo = panel._lo || []);
    hi.length = lo.length = start;
    for (let i = start; i < st.x.length; i++) {
      const ok = c[i] != null && d[i] != null;
      hi.push(ok ? c[i] + d[i] : null);
      lo.push(ok ? c[i] - d[i] : null);
    }
  }

  function column(name) {
    if (!st.cols[name]) st.cols[name] = new Array(st.x.length).fill(null);
    return st.cols[name];
  }

  function panelData(panel) {
    const data = [st.x];
    for (const s of panel.series) {
      data.push(column(s.col));
      data.push(st.smooth[s.col] ? st.smooth[s.col].out : column(s.col));
    }
    if (panel.band) data.push(panel._hi || [], panel._lo || []);
    if (panel.group_range) data.push(column("range_min"), column("range_max"));
    const idx = kept(panel);
    panel._thinned = !!idx;
    return idx ? data.map((a) => idx.map((i) => a[i])) : data;
  }

  // uPlot scans every point it is given on each setData (scale ranges, then paths), so a long run would
  // cost more to draw with every step. A line cannot show more than a few points per pixel column: past
  // four per column of the visible steps, the page hands uPlot only M4's points (Jugel et al., VLDB 2014)
  // per column: the first, last, lowest and highest of each curve, and a gap's first null. The drawn line
  // is the same; every point kept is a real step, so hover and click read exact values.
  function columns(panel) {
    return Math.max(100, Math.round((panel._cell && panel._cell.clientWidth) || 300));
  }

  function firstAtLeast(xs, v) {
    let a = 0, z = xs.length;
    while (a < z) { const m = (a + z) >> 1; if (xs[m] < v) a = m + 1; else z = m; }
    return a;
  }

  function kept(panel) {
    const n = st.x.length;
    const cols = columns(panel);
    if (n <= 4 * cols) return null;
    let lo = 0, hi = n;
    const sx = panel._u && panel._u.scales.x;
    if (panel._zoomed && sx && sx.min != null) {
      lo = Math.max(0, firstAtLeast(st.x, sx.min) - 1);
      hi = Math.min(n, firstAtLeast(st.x, sx.max) + 2);
    }
    if (hi - lo <= 4 * cols) return Array.from({ length: hi - lo }, (_, k) => lo + k);
    const lines = panel.series.map((s) => column(s.col));
    if (panel.group_range) lines.push(column("range_min"), column("range_max"));
    const idx = [];
    const per = (hi - lo) / cols;
    for (let b = 0; b < cols; b++) {
      const a = lo + Math.floor(b * per);
      const z = b === cols - 1 ? hi : lo + Math.floor((b + 1) * per);
      if (z <= a) continue;
      const pick = [a, z - 1];
      for (const c of lines) {
        let mi = -1, ma = -1, gap = -1;
        for (let i = a; i < z; i++) {
          const v = c[i];
          if (v == null) { if (gap < 0) gap = i; continue; }
          if (mi < 0 || v < c[mi]) mi = i;
          if (ma < 0 || v > c[ma]) ma = i;
        }
        if (mi >= 0) pick.push(mi, ma);
        if (gap >= 0) pick.push(gap);
      }
      pick.sort((p, q) => p - q);
      for (let k = 0; k < pick.length; k++) if (k === 0 || pick[k] !== pick[k - 1]) idx.push(pick[k]);
    }
    return idx;
  }

  // After a zoom (drag) or its reset (double click), a thinned panel takes the points of its new range.
  function rethin(panel, reset) {
    const u = panel._u;
    if (!u || !panel._thinned) return;
    if (reset) u.setData(panelData(panel), true);
    else { u.setData(panelData(panel), false); u.redraw(); }
  }

  function overlayHook(panel) {
    return (u) => {
      const ctx = u.ctx;
      const { left, top, width, height } = u.bbox;
      ctx.save();
      ctx.beginPath();
      ctx.rect(left, top, width, height);
      ctx.clip();
      ctx.setLineDash([5 * devicePixelRatio, 4 * devicePixelRatio]);
      ctx.strokeStyle = "#6b7280";
      ctx.lineWidth = devicePixelRatio;
      let alarms = 0;
      for (const [step, label, kind] of st.markers) {
        const x = u.valToPos(step, "x", true);
        const alarm = kind === "alarm"; // the reward-hacking watch: a solid red line, named on the reward panel
        if (alarm) alarms += 1;
        ctx.save();
        if (alarm) {
          ctx.setLineDash([]);
          ctx.strokeStyle = "#dc2626";
          ctx.lineWidth = 1.5 * devicePixelRatio;
        }
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
        if (alarm && panel.key === "reward" && label) {
          ctx.fillStyle = "#dc2626";
          ctx.font = `${10 * devicePixelRatio}px sans-serif`;
          ctx.textBaseline = "top";
          // several alarms' labels stacked, not overprinted; on the side of the line with room
          const y = top + (2 + 12 * ((alarms - 1) % 4)) * devicePixelRatio;
          const text = String(label).slice(0, 40);
          const right = x > left + width / 2;
          ctx.textAlign = right ? "right" : "left";
          ctx.fillText(text, right ? x - 3 * devicePixelRatio : x + 3 * devicePixelRatio, y);
        }
        ctx.restore();
      }
      if (panel.key === "reward") root.dataset.alarms = String(alarms);
      if (panel.key === "reward" && st.evals.length) {
        // held-out evaluations: a diamond each, and a dotted line at the first one's value (the baseline),
        // per color (one run live; each compared run in its own line's color)
        const baselines = new Map();
        for (const [step, value, color] of st.evals) {
          if (value == null) continue;
          const c = color || "#16a34a";
          if (!baselines.has(c)) baselines.set(c, value);
          const x = u.valToPos(step, "x", true);
          const y = u.valToPos(value, "y", true);
          ctx.setLineDash([]);
          ctx.fillStyle = c;
          ctx.beginPath();
          ctx.moveTo(x, y - 5 * devicePixelRatio);
          ctx.lineTo(x + 5 * devicePixelRatio, y);
          ctx.lineTo(x, y + 5 * devicePixelRatio);
          ctx.lineTo(x - 5 * devicePixelRatio, y);
          ctx.closePath();
          ctx.fill();
        }
        ctx.setLineDash([2 * devicePixelRatio, 3 * devicePixelRatio]);
        for (const [c, value] of baselines) {
          const y = u.valToPos(value, "y", true);
          ctx.strokeStyle = c;
          ctx.beginPath();
          ctx.moveTo(left, y);
          ctx.lineTo(left + width, y);
          ctx.stroke();
        }
        root.dataset.evalBaselines = String(baselines.size);
      }
      ctx.restore();
    };
  }

  function build(panel, cell) {
    const chartBox = cell.querySelector(".grpo-plot");
    if (panel._u) panel._u.destroy();
    chartBox.innerHTML = "";
    const logY = !!panel._log;
    const share = panel.series.some((s) => s.share);
    const series = [{ label: "step", value: (u, v) => (v == null ? "–" : String(v)) }];
    const hidden = []; // series indices whose legend rows are helpers (smoothed copies, band edges)
    for (const s of panel.series) {
      const dash = s.dashed ? [6, 4] : undefined;
      const scale = s.share ? "share" : "y";
      series.push({
        label: s.label || s.col,
        scale,
        stroke: () => (weight() > 0 ? alpha(s.color, FAINT) : s.color),
        width: 1.2,
        dash,
        spanGaps: false,
        points: { show: (u) => st.x.length <= 60, size: 4 },
        value: (u, v) => fmt(v),
      });
      hidden.push(series.length);
      series.push({ label: (s.label || s.col) + " (smoothed)", scale, stroke: s.color, width: 1.6, dash,
        points: { show: false }, show: weight() > 0, value: (u, v) => fmt(v) });
    }
    let bands;
    if (panel.band) {
      const c = panel.series[0].color;
      series.push({ label: "+std", stroke: "transparent", points: { show: false }, value: (u, v) => fmt(v) });
      series.push({ label: "−std", stroke: "transparent", points: { show: false }, value: (u, v) => fmt(v) });
      const hi = series.length - 2;
      hidden.push(hi, hi + 1);
      bands = [{ series: [hi, hi + 1], fill: alpha(c, 0.14) }];
    }
    if (panel.group_range) {
      series.push({ label: "group min", stroke: "#6b7280", width: 1, dash: [2, 3], points: { show: false },
        value: (u, v) => fmt(v) });
      series.push({ label: "group max", stroke: "#6b7280", width: 1, dash: [2, 3], points: { show: false },
        value: (u, v) => fmt(v) });
    }
    const yScale = {};
    if (logY) Object.assign(yScale, { distr: 4, log: 10, asinh: panel.key === "kl" ? 1e-4 : 1e-3 });
    else if (panel.ylim) yScale.range = panel.ylim;
    else if (panel.min_top != null) yScale.range = (u, lo, hi) => [Math.min(lo, 0), Math.max(hi * 1.1, panel.min_top)];
    const scales = { x: { time: false }, y: yScale };
    const axes = [
      { size: 28, font: "10px sans-serif", stroke: "currentColor" },
      { size: 46, font: "10px sans-serif", stroke: "currentColor", values: (u, vals) => vals.map(fmt) },
    ];
    if (share) {
      scales.share = { range: [-0.02, 1.02] };
      axes.push({ scale: "share", side: 1, size: 34, font: "10px sans-serif", stroke: "#d97706", grid: { show: false },
        values: (u, vals) => vals.map(fmt) });
    }
    const width = Math.max(240, Math.floor(cell.clientWidth || 320));
    const opts = {
      width,
      height: 170,
      series,
      bands,
      scales,
      axes,
      legend: { live: true },
      cursor: { y: false, sync: { key: model.get("sync_key") || "grpo" }, drag: { x: true, y: false, setScale: true } },
      hooks: {
        draw: [overlayHook(panel)],
        setSelect: [(u) => { if (u.select.width > 4) panel._zoomed = true; }],
        setScale: [(u, key) => {
          if (key === "x" && panel._thinned) setTimeout(() => { if (panel._zoomed) rethin(panel, false); }, 0);
        }],
        setSeries: [(u, i, o) => {
          // a click on a legend row shows/hides the curve and its smoothed copy together
          if (i != null && i % 2 === 1 && i < 2 * panel.series.length) {
            const want = u.series[i].show && weight() > 0;
            if (u.series[i + 1].show !== want) u.setSeries(i + 1, { show: want }, false);
          }
        }],
      },
    };
    const u = new uPlot(opts, panelData(panel), chartBox);
    const rows = u.root.querySelectorAll(".u-legend .u-series");
    for (const i of hidden) if (rows[i]) rows[i].style.display = "none";
    u.over.addEventListener("dblclick", () => { panel._zoomed = false; rethin(panel, true); });
    // Away from the cursor the legend shows the latest values (uPlot's own shows dashes).
    u.over.addEventListener("mouseenter", () => { panel._hover = true; });
    u.over.addEventListener("mouseleave", () => {
      panel._hover = false;
      setTimeout(() => latestLegend(panel), 0);
    });
    if (panel.key === "reward") {
      let down = null;
      u.over.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; });
      u.over.addEventListener("mouseup", (e) => {
        if (!down || Math.abs(e.clientX - down[0]) > 3) return;
        const i = u.cursor.idx;
        if (i != null && u.data[0][i] != null) model.send({ kind: "select", step: u.data[0][i] });
      });
    }
    chartBox._uplot = u;
    panel._u = u;
    panel._hidden = hidden;
  }

  function layout() {
    const spec = model.get("spec") || [];
    const old = {};
    for (const p of st.panels) old[p.key] = p;
    grid.innerHTML = "";
    st.panels = spec.map((p) => Object.assign({}, p, { _log: old[p.key] ? old[p.key]._log : false }));
    for (const p of st.panels) if (old[p.key] && old[p.key]._u) old[p.key]._u.destroy();
    for (const panel of st.panels) {
      const cell = document.createElement("div");
      cell.className = "grpo-panel";
      cell.dataset.panel = panel.key;
      const head = document.createElement("div");
      head.className = "grpo-panel-title";
      head.innerHTML = '<span class="grpo-title-text"></span> <b class="grpo-last"></b>';
      head.querySelector(".grpo-title-text").textContent = panel.title;
      if (panel.log) {
        const lab = document.createElement("label");
        lab.className = "grpo-log";
        lab.innerHTML = '<input type="checkbox"> log';
        lab.querySelector("input").addEventListener("change", (e) => {
          panel._log = e.target.checked;
          build(panel, cell);
        });
        head.appendChild(lab);
      }
      cell.appendChild(head);
      const plot = document.createElement("div");
      plot.className = "grpo-plot";
      cell.appendChild(plot);
      const note = document.createElement("div");
      note.className = "grpo-note-slot";
      cell.appendChild(note);
      grid.appendChild(cell);
      panel._cell = cell;
    }
    for (const col of Object.keys(st.cols)) smoothFrom(col, 0);
    for (const panel of st.panels) {
      derived(panel, 0);
      build(panel, panel._cell);
    }
    renderNotes();
    refreshTitles();
  }

  function renderNotes() {
    const notes = model.get("notes") || {};
    for (const panel of st.panels) {
      const slot = panel._cell.querySelector(".grpo-note-slot");
      const note = notes[panel.key];
      const key = note ? note[0] + "\u0000" + note[1] : "";
      if (slot.dataset.key === key) continue;
      slot.dataset.key = key;
      slot.innerHTML = "";
      if (!note) continue;
      const d = document.createElement("details");
      d.className = "grpo-note";
      d.dataset.panel = panel.key;
      const s = document.createElement("summary");
      s.textContent = note[0];
      const t = document.createElement("div");
      t.textContent = note[1];
      d.appendChild(s);
      d.appendChild(t);
      slot.appendChild(d);
    }
  }

  function refreshTitles() {
    for (const panel of st.panels) {
      const col = st.cols[panel.series[0].col] || [];
      let last = null;
      for (let i = col.length - 1; i >= Math.max(0, col.length - 50); i--) {
        if (col[i] != null) { last = col[i]; break; }
      }
      panel._cell.querySelector(".grpo-last").textContent = last == null ? "" : fmt(last);
    }
    root.dataset.points = String(st.x.length);
    root.dataset.step = String(st.x.length ? st.x[st.x.length - 1] : 0);
  }

  function latestLegend(panel) {
    const u = panel._u;
    if (u && !panel._hover && u.data[0].length) u.setLegend({ idx: u.data[0].length - 1 });
  }

  function draw() {
    const t0 = performance.now();
    for (const panel of st.panels) {
      if (!panel._u) continue;
      const u = panel._u;
      u.batch(() => {
        u.setData(panelData(panel), !panel._zoomed);
        if (panel._zoomed) u.redraw(); // setData without resetting scales does not redraw by itself
      });
      latestLegend(panel);
    }
    refreshTitles();
    const ms = performance.now() - t0;
    st.drawTimes.push([st.x.length, ms]);
    if (st.drawTimes.length > 5000) st.drawTimes.splice(0, 1000);
  }

  function take(msg, start) {
    st.x.length = start;
    for (const name of Object.keys(st.cols)) st.cols[name].length = start;
    for (const v of msg.x) st.x.push(v);
    for (const [name, values] of Object.entries(msg.columns)) {
      const c = column(name);
      c.length = start;
      for (const v of values) c.push(v);
    }
    for (const c of Object.values(st.cols)) while (c.length < st.x.length) c.push(null);
    for (const name of Object.keys(st.cols)) smoothFrom(name, start);
    for (const panel of st.panels) derived(panel, start);
  }

  let asked = 0;
  function hello() {
    const now = Date.now();
    if (now - asked < 1000) return;
    asked = now;
    model.send({ kind: "hello" });
  }

  function onMessage(msg) {
    if (!msg || !msg.kind) return;
    if (msg.kind === "reset") {
      st.x = [];
      st.cols = {};
      st.smooth = {};
      for (const p of st.panels) { p._hi = []; p._lo = []; }
      take(msg, 0);
      if (msg.markers) st.markers = msg.markers;
      if (msg.evals) st.evals = msg.evals;
      draw();
    } else if (msg.kind === "append") {
      if (msg.start > st.x.length) { st.gaps += 1; hello(); return; } // rows missed (a page opened late): ask for all
      take(msg, msg.start);
      draw();
    } else if (msg.kind === "overlay") {
      if (msg.markers) st.markers = msg.markers;
      if (msg.evals) st.evals = msg.evals;
      for (const panel of st.panels) if (panel._u) panel._u.redraw(false);
    }
  }

  slider.value = String(weight());
  sliderValue.textContent = weight().toFixed(2);
  slider.addEventListener("input", () => {
    model.set("smoothing", +slider.value);
    model.save_changes();
  });
  function onSmoothing() {
    slider.value = String(weight());
    sliderValue.textContent = weight().toFixed(2);
    for (const name of Object.keys(st.cols)) smoothFrom(name, 0);
    for (const panel of st.panels) {
      if (!panel._u) continue;
      for (let i = 1; i < panel._u.series.length; i++) {
        if (i % 2 === 0 && i <= 2 * panel.series.length) { // a smoothed copy: shown when smoothing and its curve are
          panel._u.setSeries(i, { show: weight() > 0 && panel._u.series[i - 1].show }, false);
        }
      }
    }
    draw();
  }
  function onCaption() {
    bar.querySelector(".grpo-caption").textContent = model.get("caption") || "";
  }

  model.on("msg:custom", onMessage);
  model.on("change:spec", layout);
  model.on("change:notes", renderNotes);
  model.on("change:smoothing", onSmoothing);
  model.on("change:caption", onCaption);
  layout();
  onCaption();
  hello();
  asked = 0; // a reply to this first hello may be slow (a busy kernel): later gaps may ask again

  let resizeTimer = null;
  const ro = new ResizeObserver(() => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const panel of st.panels) {
        if (!panel._u || !panel._cell) continue;
        const w = Math.max(240, Math.floor(panel._cell.clientWidth));
        if (Math.abs(w - panel._u.width) > 2) panel._u.setSize({ width: w, height: 170 });
      }
    }, 100);
  });
  ro.observe(root);

  return () => {
    ro.disconnect();
    model.off("msg:custom", onMessage);
    model.off("change:spec", layout);
    model.off("change:notes", renderNotes);
    model.off("change:smoothing", onSmoothing);
    model.off("change:caption", onCaption);
    for (const p of st.panels) if (p._u) p._u.destroy();
  };
}

export default { render };
