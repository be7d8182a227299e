// The "Input pipeline" tab of keras-pipeline-tuner.
//
// A plain ES module: TensorBoard loads it in an iframe whose base URL is the
// plugin's route prefix, so "./runs" reaches the plugin. No library, no build
// step: the page is made of DOM elements and SVG, so it works offline and
// within TensorBoard's Content-Security-Policy.

const SVG = "http://www.w3.org/2000/svg";
const WAIT_COLOUR = "#e8710a";
const COMPUTE_COLOUR = "#1a73e8";
const STAGE_COLOUR = "#7b1fa2";
const TIMELINE_WIDTH = 1100;
const TIMELINE_HEIGHT = 170;
const MARGIN_LEFT = 140;
const REFRESH_MS = 30000;

const state = {runs: [], run: null, other: null, zoom: {}, root: null, shown: null};

export async function render() {
  const style = element("link", {rel: "stylesheet", href: "./style.css"});
  document.head.appendChild(style);
  state.root = element("div", {class: "kpt-dashboard"});
  document.body.appendChild(state.root);
  await refresh();
  // Follows a running fit: the tuner writes at its checkpoints and epoch ends.
  setInterval(() => void refresh(), REFRESH_MS);
}

async function refresh() {
  let listing;
  try {
    listing = await getJson("./runs");
  } catch (error) {
    show(element("p", {class: "kpt-error"}, `Could not read the runs: ${error.message}`));
    return;
  }
  // Redrawn only when a run changed (new steps, a new report): not under the reader's cursor.
  const signature = JSON.stringify(listing.runs);
  if (signature === state.shown) return;
  state.shown = signature;
  state.runs = listing.runs;
  if (!state.runs.length) {
    show(element("p", {class: "kpt-empty"},
        "No run written by keras-pipeline-tuner in this log dir yet. Train with " +
        "kpt.PipelineTuner(log_dir=...) among the callbacks, then reload."));
    return;
  }
  const names = state.runs.map((run) => run.run);
  if (!names.includes(state.run)) state.run = names[0];
  if (state.other === null && names.length > 1) {
    state.other = names.find((name) => name !== state.run);
  }
  if (state.other && !names.includes(state.other)) state.other = "";
  await draw();
}

async function draw() {
  const page = element("div", {class: "kpt-page"});
  page.appendChild(pickers());
  const chosen = [state.run, state.other].filter((run) => run);
  const views = await Promise.all(chosen.map(loadRun));
  // What could not be read is said where it would have been; the rest is drawn.
  const banners = element("section", {class: "kpt-banners"});
  for (const view of views) banners.appendChild(part(`${view.run}'s verdict`, () => verdictBanner(view)));
  page.appendChild(banners);
  const readable = views.filter((view) => view.report);
  if (readable.length === 2) page.appendChild(part("the comparison", () => comparison(...readable)));
  const timelines = element("section", {class: "kpt-timelines"},
      element("h2", {}, "Step timeline"),
      element("p", {class: "kpt-hint"},
          "Input wait (orange) and compute (blue) of each training step over wall time. " +
          "Drag across a timeline to zoom in; hover a mark for its numbers."));
  // Two runs share one time and one height scale, so the faster one looks it.
  const scale = sharedScale(views);
  for (const view of views) {
    timelines.appendChild(part(`${view.run}'s timeline`, () => timelinePanel(view, scale)));
  }
  page.appendChild(timelines);
  const main = views[0];
  if (main.report) {
    page.appendChild(part("the recommendations", () => recommendations(main)));
    page.appendChild(part("the epochs", () => epochTable(main)));
    const live = part("the live model's stage table", () => liveStageTable(main));
    if (live) page.appendChild(live);
    page.appendChild(part("the stage table", () => stageTable(main)));
    const workers = part("the workers", () => workerTable(main));
    if (workers) page.appendChild(workers);
  }
  const tune = part("the kpt.tune result", () => tuneResult(main));
  if (tune) page.appendChild(tune);
  show(page);
}

// One part of the page: drawn, or a line saying why it could not be.
function part(name, build) {
  try {
    return build();
  } catch (error) {
    return element("p", {class: "kpt-error"}, `Could not show ${name}: ${error.message}`);
  }
}

async function loadRun(run) {
  const zoom = state.zoom[run] || {};
  const query = new URLSearchParams({run});
  if (zoom.first !== undefined) {
    query.set("first", zoom.first);
    query.set("last", zoom.last);
  }
  const [detail, steps] = await Promise.all([
    getJson(`./run?${new URLSearchParams({run})}`).catch((error) => (
      {run, report: null, problems: [error.message]})),
    getJson(`./steps?${query}`).catch((error) => ({problems: [error.message], ...EMPTY_STEPS})),
  ]);
  const problems = [...(detail.problems || []), ...(steps.problems || [])];
  return {run, detail, report: detail.report, steps, problems};
}

const EMPTY_STEPS = {step: [], last: [], epoch: [], start_s: [], end_s: [], wait_ms: [],
  compute_ms: [], wait_max_ms: [], compute_max_ms: [], step_max_ms: [], epochs: [],
  bucket_steps: 1};

// The two run pickers.

function pickers() {
  const names = state.runs.map((run) => run.run);
  const unreadable = new Set(state.runs.filter((run) => run.unreadable).map((run) => run.run));
  const label = (name) => unreadable.has(name) ? `${name} (unreadable)` : name;
  const main = select("kpt-run", names, state.run, label, (value) => {
    state.run = value;
    if (state.other === value) state.other = "";
    void draw();
  });
  const other = select("kpt-compare", ["", ...names.filter((n) => n !== state.run)],
      state.other || "", label, (value) => {
        state.other = value;
        void draw();
      });
  return element("div", {class: "kpt-pickers"},
      element("label", {}, "Run ", main),
      element("label", {}, "Compare with ", other));
}

function select(id, options, value, label, onChange) {
  const node = element("select", {id});
  for (const option of options) {
    const item = element("option", {value: option}, option ? label(option) : "(none)");
    if (option === value) item.selected = true;
    node.appendChild(item);
  }
  node.addEventListener("change", () => onChange(node.value));
  return node;
}

// Verdict, and two runs side by side.

function verdictBanner(view) {
  const report = view.report;
  const problems = view.problems.length ?
      element("div", {class: "kpt-problem"},
          `Could not read all of this run: ${view.problems.join("; ")}`) : "";
  if (!report) {
    return element("div", {class: "kpt-verdict kpt-unknown", "data-run": view.run},
        element("div", {class: "kpt-verdict-run"}, view.run),
        element("div", {class: "kpt-verdict-text"}, "Input pipeline: report unreadable"),
        problems);
  }
  // Every figure is the report's own (report.figures): the same as the
  // terminal's and the Text tab's, worked out once when the report was built.
  const figures = report.figures || {};
  const fraction = figures.input_fraction;
  const verdict = figures.verdict || report.verdict || "unknown";
  const parts = [];
  // The banner names what its share is: the wait at the fetch, or the input's
  // cost including its contention with the model (the replay decided).
  const decidedBy = figures.source;
  if (fraction !== null && fraction !== undefined) {
    parts.push(decidedBy === "what-if replay" ?
        `input costs ${percent(fraction)} of step time (its wait and its contention ` +
            "with the model, measured by the replay)" :
        decidedBy === "profiler" ?
            `${percent(fraction)} of step time is input (profiler window)` :
            `${percent(fraction)} of step time waiting for input`);
  }
  const step = (figures.step || {}).median_ms;
  if (step != null) {
    parts.push(`step ${ms(step)} (median: input wait ${ms((figures.wait || {}).median_ms)}, ` +
        `compute ${ms((figures.compute || {}).median_ms)})`);
  }
  if (figures.steps) parts.push(`${figures.steps} training steps (${figures.scope})`);
  const free = figures.input_free;
  if (free && free.described) parts.push(`with input free: ${free.described}`);
  const oneOff = figures.one_off || [];
  const notes = [figures.keras_line, figures.fixes_line].filter(Boolean);
  return element("div", {class: `kpt-verdict ${verdictClass(verdict)}`, "data-run": view.run},
      element("div", {class: "kpt-verdict-run"}, view.run),
      element("div", {class: "kpt-verdict-text"}, `Input pipeline: ${verdict}`),
      element("div", {class: "kpt-verdict-detail"}, parts.join(" · ")),
      figures.line ? element("div", {class: "kpt-verdict-line"}, figures.line) : "",
      oneOff.length ?
          element("div", {class: "kpt-note"}, `Left out of the verdict: ${oneOff.join("; ")}`) :
          "",
      ...notes.map((line) => element("div", {class: "kpt-note"}, line)),
      view.detail.source === "report.json" ?
          element("div", {class: "kpt-note kpt-source"}, "Read from report.json (a run written " +
              "before the dashboard's summaries).") : "",
      problems);
}

function comparison(a, b) {
  const rows = [
    ["Step (median)", (r) => stat(r, "step", "median_ms"), ms],
    ["Input wait (median)", (r) => stat(r, "wait", "median_ms"), ms],
    ["Compute (median)", (r) => stat(r, "compute", "median_ms"), ms],
    ["Input share of step time", (r) => (r.figures || {}).input_fraction, percent],
  ];
  const table = element("table", {class: "kpt-table kpt-compare-table"},
      element("tr", {}, element("th", {}, ""), element("th", {}, a.run),
          element("th", {}, b.run), element("th", {}, `${b.run} / ${a.run}`)));
  for (const [label, value, format] of rows) {
    const left = value(a.report);
    const right = value(b.report);
    const ratio = left && right != null ? times(right / left) : "-";
    table.appendChild(element("tr", {}, element("th", {}, label),
        element("td", {}, format(left)), element("td", {}, format(right)),
        element("td", {}, ratio)));
  }
  const free = (r) => (((r.figures || {}).input_free) || {}).described || "-";
  table.appendChild(element("tr", {}, element("th", {}, "With input free"),
      element("td", {}, free(a.report)), element("td", {}, free(b.report)),
      element("td", {}, "")));
  const verdict = (r) => (r.figures || {}).verdict || r.verdict;
  table.appendChild(element("tr", {}, element("th", {}, "Verdict"),
      element("td", {}, verdict(a.report)), element("td", {}, verdict(b.report)),
      element("td", {}, "")));
  table.appendChild(element("tr", {}, element("th", {}, "Steps compared"),
      element("td", {}, steadyScope(a.report)), element("td", {}, steadyScope(b.report)),
      element("td", {}, "")));
  return element("section", {class: "kpt-comparison"},
      element("h2", {}, "Runs side by side"), table);
}

// The step timeline.

function sharedScale(views) {
  const spans = views.filter((view) => view.steps.step.length);
  if (spans.length < 2) return null;
  return {
    seconds: Math.max(...spans.map((view) => stepSpan(view.steps))),
    ms: Math.max(...spans.map((view) => largestStepMs(view.steps))),
  };
}

function stepSpan(steps) {
  return Math.max(Math.max(...steps.end_s) - steps.start_s[0], 1e-6);
}

function largestStepMs(steps) {
  return Math.max(1e-6, ...steps.step.map((_, i) => Math.max(
      (steps.wait_ms[i] || 0) + (steps.compute_ms[i] || 0), (steps.step_max_ms || [])[i] || 0)));
}

function timelinePanel(view, scale) {
  const steps = view.steps;
  const panel = element("div", {class: "kpt-timeline", "data-run": view.run});
  const zoomed = state.zoom[view.run] !== undefined;
  const caption = steps.step.length ?
      `${view.run}: steps ${steps.step[0]}-${steps.last[steps.last.length - 1]}` +
      (steps.single_steps ? ", one mark per step" :
          ", marks of several steps show their mean, and their largest step as a grey " +
          "tick (hover for the steps; zoom in for more detail)") :
      `${view.run}: no step rows`;
  const header = element("div", {class: "kpt-timeline-header"},
      element("span", {}, caption));
  if (zoomed) {
    const reset = element("button", {class: "kpt-reset"}, "Show all steps");
    reset.addEventListener("click", () => {
      delete state.zoom[view.run];
      void draw();
    });
    header.appendChild(reset);
  }
  panel.appendChild(header);
  if (!steps.step.length) return panel;
  if (steps.source === "scalars") {
    panel.appendChild(element("p", {class: "kpt-note"}, "From the per-step scalars of a " +
        "run older than the dashboard: steps laid end to end (no wall-clock start)."));
  }
  panel.appendChild(stepChart(view, scale));
  const profile = view.detail.profile;
  if (profile && profile.rows && profile.rows.length && !zoomed) {
    panel.appendChild(profileChart(profile));
  }
  return panel;
}

function stepChart(view, scale) {
  const steps = view.steps;
  const t0 = steps.start_s[0];
  const t1 = Math.max(...steps.end_s);
  // A zoomed run gets its own scale: the shared one would squeeze it.
  const shared = scale && state.zoom[view.run] === undefined ? scale : null;
  const span = shared ? shared.seconds : stepSpan(steps);
  const plotWidth = TIMELINE_WIDTH - MARGIN_LEFT - 10;
  const x = (seconds) => MARGIN_LEFT + ((seconds - t0) / span) * plotWidth;
  const maxMs = shared ? shared.ms : largestStepMs(steps);
  const base = TIMELINE_HEIGHT - 25;
  const perMs = (base - 10) / maxMs;
  const svg = svgElement("svg", {width: TIMELINE_WIDTH, height: TIMELINE_HEIGHT,
      class: "kpt-steps", viewBox: `0 0 ${TIMELINE_WIDTH} ${TIMELINE_HEIGHT}`});
  svg.appendChild(svgElement("line", {x1: MARGIN_LEFT, x2: TIMELINE_WIDTH - 10,
      y1: base, y2: base, class: "kpt-axis"}));
  svg.appendChild(svgText(MARGIN_LEFT - 6, 14, `${ms(maxMs)}`, "end"));
  svg.appendChild(svgText(MARGIN_LEFT - 6, base, "0", "end"));
  svg.appendChild(svgText(MARGIN_LEFT, TIMELINE_HEIGHT - 6, "0 s", "start"));
  svg.appendChild(svgText(TIMELINE_WIDTH - 10, TIMELINE_HEIGHT - 6,
      `${span.toFixed(span < 10 ? 2 : 0)} s`, "end"));
  for (const epoch of steps.epochs) {
    if (epoch.start_s < t0 || epoch.start_s > t1) continue;
    const at = x(epoch.start_s);
    svg.appendChild(svgElement("line", {x1: at, x2: at, y1: 4, y2: base,
        class: "kpt-epoch", "data-epoch": epoch.epoch}));
    svg.appendChild(svgText(at + 3, 12, `epoch ${epoch.epoch + 1}`, "start", "kpt-epoch-label"));
  }
  const tip = element("div", {class: "kpt-tip"});
  for (let i = 0; i < steps.step.length; i++) {
    const wait = steps.wait_ms[i] || 0;
    const compute = steps.compute_ms[i] || 0;
    const left = x(steps.start_s[i]);
    const width = Math.max(1, x(steps.end_s[i]) - left - 0.3);
    const mark = svgElement("g", {class: "kpt-step-mark", "data-step": steps.step[i]});
    mark.appendChild(svgElement("rect", {x: left, width, y: base - wait * perMs,
        height: wait * perMs, fill: WAIT_COLOUR, class: "kpt-wait"}));
    mark.appendChild(svgElement("rect", {x: left, width,
        y: base - (wait + compute) * perMs, height: compute * perMs,
        fill: COMPUTE_COLOUR, class: "kpt-compute"}));
    const largest = (steps.step_max_ms || [])[i];
    if (steps.step[i] !== steps.last[i] && largest > wait + compute) {
      // The mean hides a stall in the block: its largest step stays in view.
      const top = base - largest * perMs;
      mark.appendChild(svgElement("line", {x1: left, x2: left + width, y1: top, y2: top,
          class: "kpt-step-max"}));
    }
    const text = markText(steps, i);
    mark.appendChild(svgElement("title", {}, text));
    mark.addEventListener("mousemove", (event) => {
      tip.textContent = text;
      tip.style.display = "block";
      tip.style.left = `${event.offsetX + 12}px`;
      tip.style.top = `${event.offsetY + 12}px`;
    });
    mark.addEventListener("mouseleave", () => { tip.style.display = "none"; });
    svg.appendChild(mark);
  }
  enableZoom(svg, view, x);
  return element("div", {class: "kpt-chart"}, svg, tip);
}

function markText(steps, i) {
  const wait = steps.wait_ms[i];
  const compute = steps.compute_ms[i];
  const first = steps.step[i];
  const last = steps.last[i];
  const which = first === last ? `Step ${first}` : `Steps ${first}-${last}, mean`;
  const lines = [`${which}, epoch ${steps.epoch[i] + 1}`,
    `input wait ${ms(wait)}`, `compute ${ms(compute)}`];
  if (wait != null && compute != null) lines.push(`step ${ms(wait + compute)}`);
  if (first !== last) {
    lines.push(`largest step ${ms((steps.step_max_ms || [])[i])}, ` +
        `largest wait ${ms(steps.wait_max_ms[i])}, ` +
        `largest compute ${ms(steps.compute_max_ms[i])}`);
  }
  return lines.join("\n");
}

function enableZoom(svg, view, x) {
  // Drag across the chart: the steps under the selection are fetched again,
  // in full detail when few enough.
  let from = null;
  const band = svgElement("rect", {class: "kpt-zoom-band", y: 0,
      height: TIMELINE_HEIGHT - 25, width: 0, x: 0});
  svg.appendChild(band);
  svg.addEventListener("mousedown", (event) => {
    from = event.offsetX;
    band.setAttribute("x", from);
    band.setAttribute("width", 0);
  });
  svg.addEventListener("mousemove", (event) => {
    if (from === null) return;
    band.setAttribute("x", Math.min(from, event.offsetX));
    band.setAttribute("width", Math.abs(event.offsetX - from));
  });
  svg.addEventListener("mouseup", (event) => {
    if (from === null) return;
    const [low, high] = [Math.min(from, event.offsetX), Math.max(from, event.offsetX)];
    from = null;
    band.setAttribute("width", 0);
    if (high - low < 4) return;
    const steps = view.steps;
    const inside = steps.step.filter((_, i) => {
      const left = x(steps.start_s[i]);
      return left + 1 >= low && left <= high;
    });
    if (!inside.length) return;
    const lastIndex = steps.step.indexOf(inside[inside.length - 1]);
    zoomTo(view.run, inside[0], steps.last[lastIndex]);
  });
}

function zoomTo(run, first, last) {
  state.zoom[run] = {first, last};
  void draw();
}

function profileChart(profile) {
  const rows = profile.rows;
  const end = Math.max(1e-6, ...rows.flatMap((row) =>
      row.spans_ms.map(([start, duration]) => start + duration)));
  const plotWidth = TIMELINE_WIDTH - MARGIN_LEFT - 10;
  const rowHeight = 18;
  const height = rows.length * rowHeight + 26;
  const svg = svgElement("svg", {width: TIMELINE_WIDTH, height, class: "kpt-stages",
      viewBox: `0 0 ${TIMELINE_WIDTH} ${height}`});
  rows.forEach((row, index) => {
    const y = index * rowHeight + 4;
    const group = svgElement("g", {class: "kpt-stage-row", "data-label": row.label});
    group.appendChild(svgText(MARGIN_LEFT - 6, y + 12, shorten(row.label, 22), "end"));
    for (const [start, duration] of row.spans_ms) {
      const bar = svgElement("rect", {x: MARGIN_LEFT + (start / end) * plotWidth,
          width: Math.max(0.8, (duration / end) * plotWidth), y, height: rowHeight - 5,
          fill: row.colour || STAGE_COLOUR});
      bar.appendChild(svgElement("title", {},
          `${row.label}: ${ms(duration)} from ${ms(start)}`));
      group.appendChild(bar);
    }
    svg.appendChild(group);
  });
  svg.appendChild(svgText(MARGIN_LEFT, height - 6, "0 ms", "start"));
  svg.appendChild(svgText(TIMELINE_WIDTH - 10, height - 6, ms(end), "end"));
  return element("div", {class: "kpt-profile"},
      element("div", {class: "kpt-profile-title"}, profile.title || "Profiler window"),
      svg);
}

// Advice, tables.

function recommendations(view) {
  const section = element("section", {class: "kpt-recommendations"},
      element("h2", {}, "Recommendations, most important first"));
  const list = view.report.recommendations || [];
  if (!list.length) {
    section.appendChild(element("p", {}, "Nothing to change: no recommendation for this run."));
    return section;
  }
  const ordered = element("ol", {});
  for (const item of list) {
    const card = element("li", {class: `kpt-recommendation kpt-${item.severity}`,
        "data-id": item.id},
        element("div", {class: "kpt-recommendation-title"},
            element("span", {class: "kpt-severity"}, item.severity), ` ${item.title}`));
    if (item.reason) card.appendChild(element("p", {}, item.reason));
    const gain = item.expected_gain;
    if (gain && (gain.statement || gain.speedup)) {
      // The server words it as the terminal does (describe_gain).
      const bound = typeof gain.described === "string" ? gain.described : "";
      card.appendChild(element("p", {class: "kpt-gain"},
          element("b", {}, "Expected gain: "), [bound, gain.statement].filter(Boolean).join(": ")));
    }
    if (item.evidence && item.evidence.length) {
      const evidence = element("ul", {class: "kpt-evidence"});
      for (const piece of item.evidence) {
        evidence.appendChild(element("li", {}, element("b", {}, `${piece.source}: `), piece.detail));
      }
      card.appendChild(evidence);
    }
    if (item.fix) card.appendChild(codeBlock(item.fix));
    ordered.appendChild(card);
  }
  section.appendChild(ordered);
  return section;
}

function codeBlock(code) {
  const button = element("button", {class: "kpt-copy"}, "Copy");
  button.addEventListener("click", () => {
    copyText(code).then(() => { button.textContent = "Copied"; },
        () => { button.textContent = "Select and copy"; });
  });
  return element("div", {class: "kpt-code"}, button, element("pre", {}, element("code", {}, code)));
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return;
    } catch (error) {
      // An iframe without clipboard permission: the selection route below.
    }
  }
  const area = element("textarea", {class: "kpt-copy-buffer"});
  area.value = text;
  document.body.appendChild(area);
  area.select();
  const copied = document.execCommand("copy");
  area.remove();
  if (!copied) throw new Error("copy refused");
}

function epochTable(view) {
  // Each epoch judged by the run's rule (report.figures.epochs).
  const epochs = (view.report.figures || {}).epochs || [];
  const table = element("table", {class: "kpt-table kpt-epochs"},
      headerRow(["Epoch", "Kind", "Steps", "Setup", "Step (median)", "Wait (median)",
        "Compute (median)", "Input share", "Verdict"]));
  for (const epoch of epochs) {
    table.appendChild(row([epoch.epoch + 1, epoch.kind, epoch.steps, ms(epoch.setup_ms),
      ms((epoch.step || {}).median_ms), ms((epoch.wait || {}).median_ms),
      ms((epoch.compute || {}).median_ms), percent(epoch.input_fraction),
      epoch.left_out ? `${epoch.verdict}; ${epoch.left_out}` : epoch.verdict]));
  }
  return element("section", {}, element("h2", {}, "Epochs"),
      epochs.length ? table : element("p", {}, "No epoch finished yet."));
}

function stageTable(view) {
  const profile = view.report.profile;
  // Grain pipelines are timed by Grain itself (the trigger says when).
  const grain = profile && profile.source === "grain";
  // The window's one range and share (report.figures.window), as evidence.
  const shown = (view.report.figures || {}).window;
  const span = shown ? `, steps ${shown.first_step}-${shown.last_step} ` +
      `(${shown.steps} step${shown.steps === 1 ? "" : "s"})` : "";
  const section = element("section", {class: "kpt-stage-section"},
      element("h2", {}, grain ? "Grain stages, timed by Grain"
                              : `tf.data stages in the profiler window${span}`));
  if (!profile && view.report.profile_pending) {
    section.appendChild(element("p", {},
        "The profiler window is converting (xprof): its stages join the report when ready."));
    return section;
  }
  if (!profile || !(profile.iterators || []).length) {
    section.appendChild(element("p", {}, "No profiler window was captured for this run."));
    return section;
  }
  if (grain && profile.trigger) section.appendChild(element("p", {}, profile.trigger + "."));
  if (grain && profile.conclusion) section.appendChild(element("p", {}, profile.conclusion));
  if (shown && shown.input_fraction != null) {
    section.appendChild(element("p", {},
        `The window measured ${percent(shown.input_fraction)} input over these steps.`));
  }
  const table = element("table", {class: "kpt-table kpt-stages-table"},
      headerRow(["Stage", "Iterator", "Calls", "Self time", "Share of self time", "Waits on"]));
  for (const item of profile.iterators) {
    const tr = row([item.stage, item.iterator, item.calls, ms(item.self_ms),
      percent(item.self_share), item.waiting ? "its input (not the bottleneck)" : ""]);
    if (profile.bottleneck_iterator === item.iterator) tr.classList.add("kpt-bottleneck");
    table.appendChild(tr);
  }
  section.appendChild(table);
  return section;
}

// tf.data's own model of the fit's iterator (report.stage_table), on every backend.
function liveStageTable(view) {
  const live = view.report.stage_table;
  if (!live || !(live.rows || []).length) return null;
  const section = element("section", {class: "kpt-stage-section kpt-live-stages"},
      element("h2", {}, `tf.data stages, from tf.data's live model (${live.batches} batches)`));
  const fullness = live.prefetch_fullness == null ? "" :
      ` The final prefetch was ${percent(live.prefetch_fullness)} full when read mid-pass` +
      ` (${live.prefetch_empty_reads} empty read${live.prefetch_empty_reads === 1 ? "" : "s"}).`;
  section.appendChild(element("p", {},
      `Measured by tf.data itself; read ${live.reads} time${live.reads === 1 ? "" : "s"} ` +
      `(${ms(live.read_ms)} in all). CPU budget ${live.cpu_budget ?? "?"}.` + fullness));
  const table = element("table", {class: "kpt-table kpt-stages-table"},
      headerRow(["Stage", "Runs as", "Elements", "Time per element", "Share",
                 "AUTOTUNE chose", "Buffered"]));
  let slowest = null;
  for (const item of live.rows) {
    const load = item.ms_per_batch / (item.parallelism || 1);
    if (item.ms_per_batch > 0 && (!slowest || load > slowest.load)) slowest = {item, load};
  }
  for (const item of live.rows) {
    const chosen = item.parallelism != null
      ? `parallelism ${item.parallelism}${item.parallelism_max ? " of " + item.parallelism_max : ""}`
      : item.buffer != null ? `buffer ${item.buffer}${item.buffer_max ? " of " + item.buffer_max : ""}`
      : "";
    const tr = row([item.stage, item.runs_as, item.elements, ms(item.ms_per_element),
      percent(item.share), chosen, item.buffered_elements ? `${item.buffered_elements}` : ""]);
    if (slowest && slowest.item === item) tr.classList.add("kpt-bottleneck");
    table.appendChild(tr);
  }
  section.appendChild(table);
  return section;
}

function tuneResult(view) {
  const tune = view.detail.tune;
  if (!tune) return null;
  const section = element("section", {class: "kpt-tune"},
      element("h2", {}, "kpt.tune result"),
      element("p", {}, `Original ${seconds(tune.original_s)}, tuned ${seconds(tune.tuned_s)} ` +
          `for ${tune.epochs} epoch(s): ${times(tune.ratio)} as fast (measured side by side).`),
      element("p", {}, element("b", {}, "Tuned pipeline: "), tune.tuned_pipeline || ""));
  const table = element("table", {class: "kpt-table"},
      headerRow(["Rewrite", "Stage", "Change", "Kept", "Measured ratio", "Why"]));
  for (const outcome of tune.rewrites || []) {
    table.appendChild(row([outcome.kind, outcome.stage, outcome.change,
      outcome.applied ? "kept" : outcome.status, outcome.ratio ? times(outcome.ratio) : "-",
      outcome.reason || outcome.caveat || ""]));
  }
  section.appendChild(table);
  return section;
}

function workerTable(view) {
  const workers = view.report.workers;
  if (!workers || !(workers.workers || []).length) return null;
  const table = element("table", {class: "kpt-table kpt-workers"},
      headerRow(["Worker", "Host", "Epochs", "Steps", "Mean step", "Mean wait", "Input share",
        ""]));
  for (const worker of workers.workers) {
    const train = worker.train || {};
    const straggler = worker.task === workers.straggler;
    const tr = row([worker.task + (worker.chief ? " (chief)" : ""), worker.host, worker.epochs,
      train.steps, ms((train.step || {}).mean_ms), ms((train.input_wait || {}).mean_ms),
      percent(train.input_fraction), straggler ? "straggler" : ""]);
    if (straggler) tr.classList.add("kpt-straggler");
    table.appendChild(tr);
  }
  const section = element("section", {class: "kpt-workers-section"},
      element("h2", {}, "Workers"), table);
  if (workers.straggler_reason) section.appendChild(element("p", {}, workers.straggler_reason));
  if ((workers.missing || []).length) {
    section.appendChild(element("p", {}, `No summary from: ${workers.missing.join(", ")}`));
  }
  return section;
}

// Helpers.

async function getJson(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function show(node) {
  const scrolled = window.scrollY;
  state.root.replaceChildren(node);
  window.scrollTo(0, scrolled);
}

function element(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  for (const child of children) {
    if (child === null || child === undefined || child === "") continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svgElement(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgText(x, y, text, anchor, className) {
  return svgElement("text", {x, y, "text-anchor": anchor, class: className || "kpt-label"}, text);
}

function headerRow(labels) {
  return element("tr", {}, ...labels.map((label) => element("th", {}, label)));
}

function row(values) {
  return element("tr", {}, ...values.map((value) =>
      element("td", {}, value === null || value === undefined ? "-" : value)));
}

// Runs side by side are compared by their figures (the steady state's steps,
// the verdict's share), as the compare command does.
function stat(report, name, field) {
  return (((report.figures || {})[name]) || {})[field];
}

function steadyScope(report) {
  return (report.figures || {}).scope || "all steps";
}

function verdictClass(verdict) {
  return `kpt-${String(verdict).split(" ")[0]}`;
}

function ms(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "-";
  return value >= 100 ? `${value.toFixed(0)} ms` : `${value.toFixed(2)} ms`;
}

function seconds(value) {
  return value === null || value === undefined ? "-" : `${value.toFixed(2)} s`;
}

function percent(value) {
  return value === null || value === undefined ? "-" : `${(value * 100).toFixed(1)} %`;
}

function times(value) {
  return value === null || value === undefined ? "-" : `${value.toFixed(2)}x`;
}

function shorten(text, length) {
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}
