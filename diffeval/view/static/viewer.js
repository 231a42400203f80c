// diffeval view: run tables with clickable cells, filters, a paged sample list and each sample on every model.
// Data comes from the local server's /api (diffeval view) or from data/*.js scripts (diffeval view --export).
// The page knows no task: tables and metrics come formatted, the list's columns are declared by the task, and a
// sample's view is a document of generic blocks (diffeval/tasks/blocks.py) rendered by `renderBlock`.
"use strict";

const STATIC = document.querySelector('meta[name="diffeval-mode"]').content === "static";
const PAGE_SIZE = 50;

// ---- data: one loader for both modes --------------------------------------------------------------------------
const scripts = new Map(); // static mode: path → promise of the payload its script hands over
window.diffevalData = (path, payload) => {
  const entry = scripts.get(path);
  if (entry) {
    entry.settled = true;
    entry.resolve(payload);
  }
};

function load(path, query) {
  if (!STATIC) {
    return fetch(`api/${path}${query ? `?${query}` : ""}`).then(async (response) => {
      const body = await response.json();
      if (!response.ok) throw new Error(body.error || response.statusText);
      return body;
    });
  }
  if (query) return Promise.reject(new Error("not in this export: run `diffeval view` on the run folder to see it"));
  if (!scripts.has(path)) {
    const entry = {};
    entry.promise = new Promise((resolve, reject) => Object.assign(entry, { resolve, reject }));
    scripts.set(path, entry);
    const script = document.createElement("script");
    script.src = `data/${path}.js`;
    script.onerror = () => { scripts.delete(path); entry.reject(new Error(`data/${path}.js is missing from this export`)); };
    script.onload = () => {
      script.remove();
      if (!entry.settled) { scripts.delete(path); entry.reject(new Error(`data/${path}.js holds no viewer data`)); }
    };
    document.head.appendChild(script);
  }
  return scripts.get(path).promise;
}

// ---- small DOM helpers ----------------------------------------------------------------------------------------
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "style" && typeof value === "object") {
      for (const [property, propertyValue] of Object.entries(value)) {
        if (property.startsWith("--")) node.style.setProperty(property, propertyValue);
        else node.style[property] = propertyValue;
      }
    }
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  for (const child of children.flat()) if (child) node.append(child instanceof Node ? child : String(child));
  return node;
}

function fmt(value) { // parameters and raw record fields; metrics arrive as text, formatted once in Python
  if (value === null || value === undefined) return "";
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.map((item) => fmt(item)).join(", ");
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function mark(right) {
  if (right === true) return el("span", { class: "ok", title: "right" }, "✓");
  if (right === false) return el("span", { class: "bad", title: "wrong" }, "✗");
  return "";
}

function enterClicks(event) { // table cells and sample rows open with the keyboard too
  if (event.key === "Enter") event.currentTarget.click();
}

// a block's colour: an index into the categorical palette (the same index, the same colour everywhere) or "#rrggbb"
function colour(value) { return typeof value === "number" ? `hsl(${(value * 137.508) % 360}, 62%, 52%)` : value; }

function setMessage(message) { document.getElementById("message").textContent = message || ""; }

// ---- state ----------------------------------------------------------------------------------------------------
const state = {
  runs: [],
  run: null, // the selected run's summary
  catalog: null, // its samples: [{i, id, records: [per model {params, value, right, answer, wanted} | undefined]}]
  pairSets: [],
  filters: null,
  cellLabel: "",
  page: 0,
  sample: null,
};

function emptyFilters() { return { models: null, params: {}, right: "any", pair: "any" }; }

// ---- runs -----------------------------------------------------------------------------------------------------
async function start() {
  try {
    state.runs = await load("runs");
  } catch (error) {
    setMessage(`could not load the runs: ${error.message}`);
    return;
  }
  const nav = document.getElementById("runs");
  nav.replaceChildren(...state.runs.map((run) =>
    el("button", { type: "button", "data-run": run.id, onclick: () => selectRun(run.id) }, `${run.name} (${run.task})`)));
  if (state.runs.length) await selectRun(0);
}

async function selectRun(id) {
  const run = state.runs[id];
  state.run = run;
  state.filters = emptyFilters();
  state.cellLabel = "";
  state.page = 0;
  closeSample();
  document.querySelectorAll("#runs button").forEach((b) => b.classList.toggle("active", Number(b.dataset.run) === id));
  renderRun(run);
  renderTables(run);
  let index;
  try {
    index = await load(`runs/${id}/index`);
  } catch (error) {
    setMessage(`could not load the samples of ${run.path}: ${error.message}`);
    return;
  }
  if (state.run !== run) return; // another run was chosen meanwhile
  setIndex(index);
  renderFilters();
  renderList();
}

function setIndex(raw) {
  const samples = raw.samples.map((id, i) => ({ i, id, records: new Array(raw.models.length) }));
  for (const [sample, model, params, value, right, answer, wanted] of raw.records) {
    samples[sample].records[model] = { params, value, right, answer, wanted };
  }
  state.catalog = { ...raw, samples, modelPos: Object.fromEntries(raw.models.map((m, i) => [m, i])),
    paramPos: Object.fromEntries(raw.params.map((p, i) => [p, i])) };
  state.pairSets = raw.pairs.map((pair) => new Set(pair.samples));
}

function renderRun(run) {
  const c = run.counts;
  const models = run.models.map((m) => `${m.name}${m.differential ? " (DIFF)" : ""}`).join(", ");
  const parts = [
    el("h2", {}, `${run.task}: ${run.path}`),
    el("p", { class: "counts", id: "counts" },
      `${c.records} records · ${c.samples} samples · models: ${models || "none yet"}`),
  ];
  if (c.damaged || c.duplicates) {
    parts.push(el("p", { class: "warning", id: "dropped" },
      `skipped ${c.damaged} damaged line(s) and ${c.duplicates} duplicate record(s) in samples.jsonl`));
  }
  parts.push(el("p", { class: "note" }, run.note));
  document.getElementById("run").replaceChildren(...parts);
}

// ---- tables ---------------------------------------------------------------------------------------------------
function renderTables(run) {
  const blocks = run.tables.map((table) => {
    const head = el("tr", {}, table.index_names.map((n) => el("th", {}, n)), table.columns.map((c) => el("th", {}, c)));
    const body = table.rows.map((row, r) => el("tr", {},
      row.label.map((label) => el("th", {}, label)),
      row.texts.map((text, c) => {
        const filter = row.cells[c];
        if (!filter) return el("td", {}, text);
        const label = `${table.title}: ${row.label.join(" / ")}, ${table.columns[c]}`;
        return el("td", {
          class: "cell-link", title: "list these samples", "data-table": table.key, "data-row": r, "data-col": c,
          tabindex: 0, onkeydown: enterClicks, onclick: (event) => applyCell(filter, label, event.currentTarget),
        }, text);
      })));
    return el("div", { class: "table-block" }, el("h3", {}, table.title),
      el("div", { class: "table-wrap" }, el("table", { class: "result", "data-key": table.key }, el("thead", {}, head),
        el("tbody", {}, body))));
  });
  document.getElementById("tables").replaceChildren(...(blocks.length ? blocks : [el("p", { class: "hint" }, "No finished samples yet.")]));
}

function applyCell(filter, label, cell) {
  const filters = emptyFilters();
  for (const [key, value] of Object.entries(filter)) {
    const values = (Array.isArray(value) ? value : [value]).map(String);
    if (key === "model") filters.models = values;
    else if (key === "pair") { // the samples this DIFF model and this baseline both scored
      const p = state.catalog.pairs.findIndex((pair) => pair.diff === values[0] && pair.base === values[1]);
      if (p >= 0) filters.pair = `${p}:both`;
    } else filters.params[key] = values;
  }
  state.filters = filters;
  state.cellLabel = label;
  state.page = 0;
  document.querySelectorAll("td.cell-link.selected").forEach((td) => td.classList.remove("selected"));
  cell.classList.add("selected");
  renderFilters();
  renderList();
  document.getElementById("samples").scrollIntoView({ block: "start" });
}

// ---- filters --------------------------------------------------------------------------------------------------
function renderFilters() {
  const index = state.catalog;
  const f = state.filters;
  const onchange = () => {
    const before = JSON.stringify([state.filters.models, state.filters.params]);
    readFilters();
    // right/wrong and pair filters narrow a clicked cell's samples; a change of model or parameters leaves the cell
    if (JSON.stringify([state.filters.models, state.filters.params]) !== before) state.cellLabel = "";
    state.page = 0;
    renderList();
  };
  const select = (name, label, options, current) => {
    const chosen = current === null ? "" : current.map(String).join("|");
    const all = options.some(([value]) => value === chosen) ? options : [...options, [chosen, chosen]];
    return el("label", {}, label, el("select", { name, onchange },
      all.map(([value, text]) => el("option", { value, selected: value === chosen }, text))));
  };
  const controls = [select("model", "model", [["", "all models"], ...index.models.map((m) => [m, m])], f.models)];
  index.params.forEach((param, p) => {
    const values = [...new Set(index.samples.flatMap((s) => s.records.filter(Boolean).map((r) => r.params[p])))]
      .filter((v) => v !== null).sort((a, b) => (typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b))));
    controls.push(select(`param:${param}`, param, [["", "all"], ...values.map((v) => [String(v), fmt(v)])], f.params[param] || null));
  });
  const hasOutcomes = index.samples.some((s) => s.records.some((r) => r && r.right !== null));
  if (hasOutcomes) {
    controls.push(select("right", "right or wrong", [["", "any"], ["right", "right"], ["wrong", "wrong"]],
      f.right === "any" ? null : [f.right]));
  }
  if (index.pairs.length && hasOutcomes) {
    const options = [["", "any"]];
    index.pairs.forEach((pair, p) => {
      const names = index.pairs.length > 1 ? ` (${pair.diff} vs ${pair.base})` : "";
      options.push([`${p}:diff`, `DIFF right, baseline wrong${names}`], [`${p}:base`, `baseline right, DIFF wrong${names}`],
        [`${p}:both`, `both scored${names}`]);
    });
    controls.push(select("pair", "DIFF vs baseline (paired)", options, f.pair === "any" ? null : [f.pair]));
  }
  controls.push(el("button", { type: "button", id: "clear-filters", onclick: () => {
    state.filters = emptyFilters(); state.cellLabel = ""; state.page = 0;
    document.querySelectorAll("td.cell-link.selected").forEach((td) => td.classList.remove("selected"));
    renderFilters(); renderList();
  } }, "clear filters"));
  document.getElementById("filters").replaceChildren(...controls);
}

function readFilters() {
  const filters = emptyFilters();
  for (const node of document.querySelectorAll("#filters select")) {
    if (!node.value) continue;
    const values = node.value.split("|");
    if (node.name === "model") filters.models = values;
    else if (node.name === "right") filters.right = node.value;
    else if (node.name === "pair") filters.pair = node.value;
    else filters.params[node.name.slice("param:".length)] = values;
  }
  state.filters = filters;
}

function recordMatches(record, model) {
  const f = state.filters;
  if (f.models && !f.models.includes(state.catalog.models[model])) return false;
  for (const [key, allowed] of Object.entries(f.params)) {
    const value = String(record.params[state.catalog.paramPos[key]]);
    if (!allowed.some((a) => String(a) === value)) return false;
  }
  if (f.right === "right" && record.right !== true) return false;
  if (f.right === "wrong" && record.right !== false) return false;
  return true;
}

function sampleMatches(sample) {
  const f = state.filters;
  if (f.pair !== "any") {
    const [p, kind] = f.pair.split(":");
    const pair = state.catalog.pairs[Number(p)];
    if (!state.pairSets[Number(p)].has(sample.i)) return false;
    const diff = sample.records[state.catalog.modelPos[pair.diff]];
    const base = sample.records[state.catalog.modelPos[pair.base]];
    if (kind === "diff" && !(diff.right === true && base.right === false)) return false;
    if (kind === "base" && !(base.right === true && diff.right === false)) return false;
  }
  return sample.records.some((record, model) => record && recordMatches(record, model));
}

// ---- the paged sample list ------------------------------------------------------------------------------------
function renderList() {
  const index = state.catalog;
  const matching = index.samples.filter(sampleMatches);
  const pages = Math.max(1, Math.ceil(matching.length / PAGE_SIZE));
  state.page = Math.min(state.page, pages - 1);
  const shown = matching.slice(state.page * PAGE_SIZE, (state.page + 1) * PAGE_SIZE);
  document.getElementById("active-cell").textContent = state.cellLabel ? `cell: ${state.cellLabel}` : "";
  document.getElementById("match-count").textContent = `${matching.length} of ${index.samples.length} samples match`;
  const models = index.models.map((m, i) => [m, i]); // side by side, whichever model the filters look at
  const head = el("tr", {}, el("th", {}, "sample"), index.params.map((p) => el("th", {}, p)),
    models.map(([m]) => el("th", {}, m)));
  const rows = shown.map((sample) => {
    const first = sample.records.find(Boolean);
    return el("tr", { class: `sample-row${state.sample === sample.id ? " open" : ""}`, "data-sample": sample.id,
      tabindex: 0, onkeydown: enterClicks, onclick: () => openSample(sample.id) },
    el("td", { class: "mono sample-id" }, sample.id.slice(0, 8)),
    index.params.map((p, i) => el("td", {}, fmt(first.params[i]))),
    models.map(([, m]) => {
      const record = sample.records[m];
      if (!record) return el("td", { class: "hint" }, "not run");
      return el("td", { "data-model": index.models[m] }, mark(record.right), " ",
        el("span", { class: "mono" }, record.answer ?? record.value));
    }));
  });
  document.getElementById("sample-list").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  const go = (page) => { state.page = page; renderList(); };
  document.getElementById("pager").replaceChildren(
    el("button", { type: "button", disabled: state.page === 0, onclick: () => go(state.page - 1) }, "‹ previous"),
    el("span", {}, `page ${state.page + 1} of ${pages}`),
    el("button", { type: "button", disabled: state.page >= pages - 1, onclick: () => go(state.page + 1) }, "next ›"));
}

// ---- one sample ----------------------------------------------------------------------------------------------
// The pane takes the right half only while a sample is open: closed, it is one line of hint and the tables have the
// page's width.
function closeSample() {
  state.sample = null;
  document.querySelector("main").classList.remove("with-sample");
  document.querySelectorAll("#sample-list tr.sample-row.open").forEach((tr) => tr.classList.remove("open"));
  document.getElementById("sample").replaceChildren(
    el("p", { class: "hint" }, "Click a table cell to list its samples, then a sample to see it on every model."));
}

document.addEventListener("keydown", (event) => { if (event.key === "Escape" && state.sample !== null) closeSample(); });

function sampleHead(id) {
  return el("div", { class: "pane-head" }, el("h2", {}, `Sample ${id}`),
    el("button", { type: "button", id: "close-sample", title: "close the sample (Esc): the tables take the page again",
      onclick: closeSample }, "close ×"));
}

async function openSample(id, full = false) {
  state.sample = id;
  const run = state.run;
  document.querySelector("main").classList.add("with-sample");
  document.querySelectorAll("#sample-list tr.sample-row").forEach((tr) => tr.classList.toggle("open", tr.dataset.sample === id));
  const pane = document.getElementById("sample");
  pane.replaceChildren(el("p", { class: "hint" }, "loading…"));
  let detail, failure;
  try {
    detail = await load(`runs/${run.id}/samples/${encodeURIComponent(id)}`, full ? "full=1" : "");
  } catch (error) {
    failure = error;
  }
  if (state.sample !== id || state.run !== run) return; // closed, or another sample or run was opened meanwhile
  if (failure) {
    pane.replaceChildren(sampleHead(id), el("p", { class: "warning" }, `could not load sample ${id}: ${failure.message}`));
    return;
  }
  const records = detail.records;
  const first = Object.values(records)[0] || {};
  const compared = detail.comparison;
  const parts = [
    sampleHead(id),
    el("dl", { class: "fields" }, state.catalog.params.flatMap((p) => [el("dt", {}, p), el("dd", {}, fmt(first[p]))])),
    el("table", { class: "result", id: "comparison" },
      el("thead", {}, el("tr", {}, compared.headings.map((h) => el("th", {}, h)))),
      el("tbody", {}, compared.rows.map((row) => el("tr", { "data-model": row.model }, el("th", {}, row.model),
        row.cells.map((cell) => el("td", { class: "mono" }, cell ?? "")), el("td", {}, mark(row.right)))))),
  ];
  if (detail.view_error) parts.push(el("p", { class: "warning" }, detail.view_error));
  const context = { id, expandAll: full };
  if (detail.view) parts.push(...detail.view.blocks.map((block) => renderBlock(block, context)));
  else parts.push(...recordFields(records));
  parts.push(el("details", { class: "raw-records" }, el("summary", {}, "every field of the records"), recordFields(records)));
  pane.replaceChildren(...parts);
}

function recordFields(records) { // a task without a view, or a view that could not be rebuilt: the records as they are
  return Object.entries(records).map(([model, record]) => el("div", { class: "model-block", "data-model": model },
    el("h3", {}, model),
    el("dl", { class: "fields" }, Object.entries(record).flatMap(([k, v]) => [el("dt", {}, k),
      el("dd", { class: "mono" }, fmt(v))]))));
}

// ---- blocks: a sample's view, as a task's sample_view declared it ------------------------------------------------
function renderBlock(block, context) {
  const render = BLOCKS[block.type];
  const body = render ? render(block, context) : el("p", { class: "warning" }, `unknown block type ${block.type}`);
  if (block.model !== undefined) body.dataset.model = block.model;
  if (block.title === undefined || block.type === "section" || block.type === "outputs") return body;
  return el("div", { class: "block", "data-model": block.model }, el("h3", {}, block.title), body);
}

function renderText(block, context) {
  const node = block.style === "paragraph" ? el("p") : el(block.style === "mono" ? "p" : "div", { class: block.style });
  node.append(...block.pieces.map((piece) => renderPiece(piece, context)));
  return node;
}

function renderPiece(piece, context) {
  if (typeof piece === "string") return piece;
  if (piece.span !== undefined) return el("span", { class: `tone-${piece.tone}` }, piece.span);
  if (piece.mark !== undefined) {
    return el("mark", { class: [piece.kind, `tone-${piece.tone}`].filter(Boolean).join(" "), title: piece.note },
      piece.mark.map((inner) => renderPiece(inner, context)));
  }
  return renderElided(piece, context);
}

// A long stretch shows its two ends and a button for the middle: from the payload when it came whole, else (server)
// by asking for the sample again with whole texts.
function renderElided(part, context) {
  const tone = part.tone ? `tone-${part.tone}` : null;
  const whole = el("span", { class: tone }, part.text ?? "");
  if (part.text !== undefined && context.expandAll) return whole;
  const holder = el("span", { class: "elided" });
  const button = el("button", { type: "button", class: "expand", title: "show the middle" }, part.hidden);
  if (part.text !== undefined) button.addEventListener("click", () => holder.replaceWith(whole));
  else if (!STATIC) button.addEventListener("click", () => openSample(context.id, true));
  else {
    button.disabled = true;
    button.title = "this export holds long texts elided: run `diffeval view` on the run folder to read them whole";
  }
  holder.append(el("span", { class: tone }, part.head), button, el("span", { class: tone }, part.tail));
  return holder;
}

function renderFields(block) {
  return el("dl", { class: "fields" }, block.rows.flatMap((row) => [el("dt", {}, row.label), el("dd", {}, row.text)]));
}

function renderOutputs(block) {
  const rows = block.rows.map((row) => el("div", { class: "model-block", "data-model": row.model },
    el("h3", {}, `${row.model}: `, el("span", { class: row.right === true ? "ok" : row.right === false ? "bad" : "hint" },
      row.label ?? ""), " ", mark(row.right)),
    el("p", { class: "mono" }, row.text ?? ""),
    row.fields.length ? renderFields({ rows: row.fields }) : null));
  return el("div", { class: "outputs" }, block.title ? el("h3", {}, block.title) : null, rows);
}

function renderSection(block, context) {
  return el("div", { class: "model-block" }, block.title ? el("h3", {}, block.title, " ", mark(block.right)) : null,
    block.blocks.map((inner) => renderBlock(inner, context)));
}

function renderNotice(block) { return el("p", { class: block.level === "warning" ? "warning" : "hint" }, block.text); }

function renderBars(block) {
  const values = block.bars.map((bar) => bar.value);
  const best = Math.max(...values), worst = Math.min(...values);
  return el("table", { class: "result bars" }, el("tbody", {}, block.bars.map((bar) => el("tr", { class: bar.emphasis ? "emphasis" : null },
    el("th", { style: { color: bar.colour === null ? null : colour(bar.colour) } }, bar.label, bar.note ? ` ${bar.note}` : ""),
    el("td", {}, bar.text),
    el("td", { class: "bar-cell" }, el("span", { class: "bar", style: {
      width: `${best === worst ? 100 : 4 + 120 * (bar.value - worst) / (best - worst)}px`,
      background: bar.emphasis ? "var(--accent)" : "#c3cad6" } }))))));
}

function renderLabels(block) {
  const present = new Set(block.sequence);
  const legend = el("div", { class: "legend" }, block.names.map((name, i) =>
    present.has(i) ? el("span", { style: { "--swatch": colour(i) } }, name) : null));
  const sequence = el("div", { class: "labels" }, block.sequence.map((label, k) =>
    el("span", { class: "shot", "data-label": label, title: `${k + 1}: ${block.names[label]}`,
      style: { background: colour(label) } })));
  return el("div", {}, sequence, legend);
}

function renderChart(block) {
  const values = block.series.flatMap((s) => s.values);
  const low = Math.min(0, ...values), high = Math.max(0.01, ...values);
  const step = block.series.length * 6 + 8;
  const width = 40 + block.categories.length * step, height = 120, top = 18, bottom = 20;
  const y = (v) => top + (height - top - bottom) * (high - v) / (high - low);
  const chart = svg("svg", { class: "chart", width, height, role: "img", "aria-label": block.title || "chart" },
    svg("line", { x1: 34, x2: width, y1: y(0), y2: y(0), stroke: "#999" }),
    svg("text", { x: 2, y: y(high) + 4 }, high.toFixed(2)), svg("text", { x: 2, y: y(low) }, low.toFixed(2)));
  block.categories.forEach((category, c) => {
    const x0 = 38 + c * step;
    block.series.forEach((series, k) => {
      const v = series.values[c];
      chart.append(svg("rect", { x: x0 + k * 6, y: Math.min(y(v), y(0)), width: 5, height: Math.max(1, Math.abs(y(v) - y(0))),
        fill: colour(series.colour) }, svg("title", {}, `${category} ${series.name}: ${series.texts[c]}`)));
    });
    chart.append(svg("text", { x: x0, y: height - 6 }, category));
  });
  const legend = el("div", { class: "legend" }, block.series.map((s) => el("span", { style: { "--swatch": colour(s.colour) } }, s.name)));
  return el("div", { class: "chart-block" }, legend, chart);
}

const BLOCKS = {
  text: renderText, fields: renderFields, outputs: renderOutputs, bars: renderBars, chart: renderChart,
  labels: renderLabels, notice: renderNotice, section: renderSection,
};

start();
