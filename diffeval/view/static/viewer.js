// diffeval view: run tables with clickable cells, filters, a paged sample list and each sample on every model.
// Data comes from the local server's /api (diffeval view) or from data/*.js scripts (diffeval view --export).
"use strict";

const STATIC = document.querySelector('meta[name="diffeval-mode"]').content === "static";
const PAGE_SIZE = 50;
const SEGMENT_COLOURS = { answer: "#d62728", needles: "#ff7f0e", noise: "#7f7f7f", scaffold: "#1f77b4", sink: "#9467bd" };

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
      for (const [property, setting] of Object.entries(value)) {
        if (property.startsWith("--")) node.style.setProperty(property, setting);
        else node.style[property] = setting;
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

function fmt(value, decimals) {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") {
    if (decimals === undefined) decimals = Number.isInteger(value) ? 0 : 3;
    return value.toFixed(decimals);
  }
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.map((item) => fmt(item)).join(", ");
  return String(value);
}

function mark(outcome) {
  if (outcome === true) return el("span", { class: "ok", title: "right" }, "✓");
  if (outcome === false) return el("span", { class: "bad", title: "wrong" }, "✗");
  return "";
}

function enterClicks(event) { // table cells and sample rows open with the keyboard too
  if (event.key === "Enter") event.currentTarget.click();
}

function classColour(i) { return `hsl(${(i * 137.508) % 360}, 62%, 52%)`; }

function setStatus(message) { document.getElementById("status").textContent = message || ""; }

// ---- state ----------------------------------------------------------------------------------------------------
const state = {
  runs: [],
  run: null, // the selected run's summary
  index: null, // its samples: [{i, id, records: [per model {params, score, outcome, output, expected} | undefined]}]
  pairSets: [],
  filters: null,
  cellLabel: "",
  page: 0,
  sample: null,
};

function emptyFilters() { return { models: null, params: {}, outcome: "any", pair: "any" }; }

// ---- runs -----------------------------------------------------------------------------------------------------
async function start() {
  try {
    state.runs = await load("runs");
  } catch (error) {
    setStatus(`could not load the runs: ${error.message}`);
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
  state.sample = null;
  document.querySelectorAll("#runs button").forEach((b) => b.classList.toggle("active", Number(b.dataset.run) === id));
  renderRun(run);
  renderTables(run);
  document.getElementById("sample").replaceChildren(
    el("p", { class: "hint" }, "Click a table cell to list its samples, then a sample to see it on every model."));
  let index;
  try {
    index = await load(`runs/${id}/index`);
  } catch (error) {
    setStatus(`could not load the samples of ${run.path}: ${error.message}`);
    return;
  }
  if (state.run !== run) return; // another run was chosen meanwhile
  setIndex(index);
  renderFilters();
  renderList();
}

function setIndex(raw) {
  const samples = raw.samples.map((id, i) => ({ i, id, records: new Array(raw.models.length) }));
  for (const [sample, model, params, score, outcome, output, expected] of raw.records) {
    samples[sample].records[model] = { params, score, outcome, output, expected };
  }
  state.index = { ...raw, samples, modelPos: Object.fromEntries(raw.models.map((m, i) => [m, i])),
    paramPos: Object.fromEntries(raw.params.map((p, i) => [p, i])) };
  state.pairSets = raw.pairs.map((pair) => new Set(pair.samples));
}

function renderRun(run) {
  const c = run.counts;
  const models = run.models.map((m) => `${m.name}${m.is_diff ? " (DIFF)" : ""}`).join(", ");
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
    // JSON drops the difference between 1 and 1.0: a column with any fraction shows every number with 3 decimals
    const decimals = table.columns.map((_, c) => (table.rows.some((row) =>
      typeof row.values[c] === "number" && !Number.isInteger(row.values[c])) ? 3 : 0));
    const head = el("tr", {}, table.index_names.map((n) => el("th", {}, n)), table.columns.map((c) => el("th", {}, c)));
    const body = table.rows.map((row, r) => el("tr", {},
      row.label.map((label) => el("th", {}, fmt(label))),
      row.values.map((value, c) => {
        const filter = row.cells[c];
        if (!filter) return el("td", {}, fmt(value, decimals[c]));
        const label = `${table.title}: ${row.label.map((part) => fmt(part)).join(" / ")}, ${table.columns[c]}`;
        return el("td", {
          class: "cell-link", title: "list these samples", "data-table": table.key, "data-row": r, "data-col": c,
          tabindex: 0, onkeydown: enterClicks, onclick: (event) => applyCell(filter, label, event.currentTarget),
        }, fmt(value, decimals[c]));
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
      const p = state.index.pairs.findIndex((pair) => pair.diff === values[0] && pair.base === values[1]);
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
  const index = state.index;
  const f = state.filters;
  const onchange = () => {
    const before = JSON.stringify([state.filters.models, state.filters.params]);
    readFilters();
    // outcome and pair filters narrow a clicked cell's samples; a change of model or parameters leaves the cell
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
  const hasOutcomes = index.samples.some((s) => s.records.some((r) => r && r.outcome !== null));
  if (hasOutcomes) {
    controls.push(select("outcome", "outcome", [["", "any"], ["right", "right"], ["wrong", "wrong"]],
      f.outcome === "any" ? null : [f.outcome]));
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
    else if (node.name === "outcome") filters.outcome = node.value;
    else if (node.name === "pair") filters.pair = node.value;
    else filters.params[node.name.slice("param:".length)] = values;
  }
  state.filters = filters;
}

function recordMatches(record, model) {
  const f = state.filters;
  if (f.models && !f.models.includes(state.index.models[model])) return false;
  for (const [key, allowed] of Object.entries(f.params)) {
    const value = String(record.params[state.index.paramPos[key]]);
    if (!allowed.some((a) => String(a) === value)) return false;
  }
  if (f.outcome === "right" && record.outcome !== true) return false;
  if (f.outcome === "wrong" && record.outcome !== false) return false;
  return true;
}

function sampleMatches(sample) {
  const f = state.filters;
  if (f.pair !== "any") {
    const [p, kind] = f.pair.split(":");
    const pair = state.index.pairs[Number(p)];
    if (!state.pairSets[Number(p)].has(sample.i)) return false;
    const diff = sample.records[state.index.modelPos[pair.diff]];
    const base = sample.records[state.index.modelPos[pair.base]];
    if (kind === "diff" && !(diff.outcome === true && base.outcome === false)) return false;
    if (kind === "base" && !(base.outcome === true && diff.outcome === false)) return false;
  }
  return sample.records.some((record, model) => record && recordMatches(record, model));
}

// ---- the paged sample list ------------------------------------------------------------------------------------
function renderList() {
  const index = state.index;
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
    el("td", { class: "output sample-id" }, sample.id.slice(0, 8)),
    index.params.map((p, i) => el("td", {}, fmt(first.params[i]))),
    models.map(([, m]) => {
      const record = sample.records[m];
      if (!record) return el("td", { class: "hint" }, "not run");
      return el("td", { "data-model": index.models[m] }, mark(record.outcome), " ",
        el("span", { class: "output" }, record.output ?? fmt(record.score)));
    }));
  });
  document.getElementById("sample-list").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  const go = (page) => { state.page = page; renderList(); };
  document.getElementById("pager").replaceChildren(
    el("button", { type: "button", disabled: state.page === 0, onclick: () => go(state.page - 1) }, "‹ previous"),
    el("span", {}, `page ${state.page + 1} of ${pages}`),
    el("button", { type: "button", disabled: state.page >= pages - 1, onclick: () => go(state.page + 1) }, "next ›"));
}

// ---- one sample -----------------------------------------------------------------------------------------------
async function openSample(id, full = false) {
  state.sample = id;
  const run = state.run;
  document.querySelectorAll("#sample-list tr.sample-row").forEach((tr) => tr.classList.toggle("open", tr.dataset.sample === id));
  const pane = document.getElementById("sample");
  pane.replaceChildren(el("p", { class: "hint" }, "loading…"));
  let detail;
  try {
    detail = await load(`runs/${run.id}/samples/${encodeURIComponent(id)}`, full ? "full=1" : "");
  } catch (error) {
    pane.replaceChildren(el("p", { class: "warning" }, `could not load sample ${id}: ${error.message}`));
    return;
  }
  if (state.sample !== id || state.run !== run) return; // another sample or run was opened meanwhile
  const records = detail.records;
  const models = Object.keys(records);
  const value = (m, key) => fmt(records[m][key]);
  const parts = [
    el("h2", {}, `Sample ${id}`),
    el("dl", { class: "fields" }, state.index.params.flatMap((p) => [el("dt", {}, p), el("dd", {}, value(models[0], p))])),
    el("table", { class: "result", id: "comparison" },
      el("thead", {}, el("tr", {}, ["model", "expected", "output", "score", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, models.map((m) => {
        const brief = state.index.samples.find((s) => s.id === id)?.records[state.index.modelPos[m]];
        return el("tr", { "data-model": m }, el("th", {}, m),
          el("td", { class: "output" }, fmt(records[m].expected ?? records[m].gold_label ?? records[m].reference ?? brief?.expected)),
          el("td", { class: "output" }, records[m].output ?? records[m].predicted_label ?? ""),
          el("td", {}, fmt(records[m][state.run.value])),
          el("td", {}, mark(brief?.outcome)));
      }))),
  ];
  if (detail.view_error) parts.push(el("p", { class: "warning" }, detail.view_error));
  const render = VIEWS[detail.task] || genericView;
  parts.push(...render(detail, id, full));
  pane.replaceChildren(...parts);
}

function genericView(detail) {
  return Object.entries(detail.records).map(([model, record]) => el("div", { class: "model-block" },
    el("h3", {}, model),
    el("dl", { class: "fields" }, Object.entries(record).flatMap(([k, v]) => [el("dt", {}, k),
      el("dd", { class: "output" }, typeof v === "object" && v !== null ? JSON.stringify(v) : fmt(v))]))));
}

// A long stretch shows its two ends and a button for the middle: from the payload when it came whole, else (server)
// by asking for the sample again with whole texts.
function elided(part, id, expandAll, label, kind) {
  const whole = el("span", { class: kind }, part.text ?? "");
  if (part.head === undefined || (part.text !== undefined && expandAll)) return whole;
  const holder = el("span", { class: "elided" });
  const button = el("button", { type: "button", class: "expand", title: "show the middle" }, label);
  if (part.text !== undefined) button.addEventListener("click", () => holder.replaceWith(whole));
  else if (!STATIC) button.addEventListener("click", () => openSample(id, true));
  else {
    button.disabled = true;
    button.title = "this export holds long texts elided: run `diffeval view` on the run folder to read them whole";
  }
  holder.append(el("span", { class: kind }, part.head), button, el("span", { class: kind }, part.tail));
  return holder;
}

function needleView(detail, id, expandAll) {
  if (!detail.view) return genericView(detail);
  return Object.entries(detail.view.prompts).map(([model, prompt]) => {
    const block = el("div", { class: "model-block", "data-model": model });
    if (prompt.error) {
      block.append(el("h3", {}, `Prompt (${model})`), el("p", { class: "warning" }, prompt.error));
      return block;
    }
    block.append(el("h3", {}, `Prompt as ${model} tokenized it (${prompt.tokens} tokens)`));
    if (!prompt.matches_record) {
      block.append(el("p", { class: "warning" }, "the rebuilt prompt differs from the recorded one (tokenizer or data changed since the run)"));
    }
    const text = el("div", { class: "prompt", "data-model": model });
    for (const segment of prompt.segments) {
      if (segment.kind === "text") text.append(el("span", { class: "scaffold" }, segment.text));
      else if (segment.kind === "haystack") {
        text.append(elided(segment, id, expandAll, `… ${segment.elided} haystack tokens …`, "haystack"));
      } else if (segment.kind === "needle") {
        text.append(el("mark", { class: `needle${segment.queried ? "" : " other"}`,
          title: `${segment.queried ? "queried" : "other"} needle: ${segment.city}, tokens ${segment.tokens[0]}-${segment.tokens[1]}` },
        segment.before, el("mark", { class: "number", "data-expected": segment.expected,
          title: `recorded span: tokens ${segment.number_tokens[0]}-${segment.number_tokens[1]}` }, segment.number),
        segment.after));
      }
    }
    block.append(text);
    return block;
  });
}

function attentionView(detail) {
  const blocks = Object.entries(detail.records).map(([model, record]) => {
    const shares = record.shares || {};
    const panels = Object.entries(shares).map(([map, segments]) => shareChart(map, segments));
    return el("div", { class: "model-block", "data-model": model },
      el("h3", {}, `${model}: attention shares per layer, query rows ${fmt(record.rows)}`), el("div", {}, panels));
  });
  const legend = el("div", { class: "legend" }, Object.entries(SEGMENT_COLOURS).map(([name, colour]) =>
    el("span", { style: { "--swatch": colour } }, name)));
  return [legend, ...blocks];
}

function shareChart(map, segments) {
  const names = Object.keys(SEGMENT_COLOURS).filter((s) => segments[s]);
  const layers = segments[names[0]]?.length || 0;
  const values = names.flatMap((s) => segments[s]);
  const low = Math.min(0, ...values), high = Math.max(0.01, ...values);
  const width = 40 + layers * (names.length * 6 + 8), height = 120, top = 18, bottom = 20;
  const y = (v) => top + (height - top - bottom) * (high - v) / (high - low);
  const chart = svg("svg", { class: "chart", width, height, "data-map": map, role: "img", "aria-label": `${map} shares per layer` },
    svg("text", { x: 4, y: 12 }, `${map}`),
    svg("line", { x1: 34, x2: width, y1: y(0), y2: y(0), stroke: "#999" }),
    svg("text", { x: 2, y: y(high) + 4 }, high.toFixed(2)), svg("text", { x: 2, y: y(low) }, low.toFixed(2)));
  for (let layer = 0; layer < layers; layer++) {
    const x0 = 38 + layer * (names.length * 6 + 8);
    names.forEach((name, k) => {
      const v = segments[name][layer];
      chart.append(svg("rect", { x: x0 + k * 6, y: Math.min(y(v), y(0)), width: 5, height: Math.max(1, Math.abs(y(v) - y(0))),
        fill: SEGMENT_COLOURS[name] }, svg("title", {}, `layer ${layer} ${name}: ${v.toFixed(4)}`)));
    });
    chart.append(svg("text", { x: x0, y: height - 6 }, `L${layer}`));
  }
  return chart;
}

function iclView(detail) {
  const view = detail.view;
  if (!view) return genericView(detail);
  const legend = el("div", { class: "legend" }, view.labels.map((label, i) =>
    view.sequence.includes(i) ? el("span", { style: { "--swatch": classColour(i) } }, label) : null));
  const sequence = el("div", { class: "labels", id: "label-sequence" }, view.sequence.map((label, k) =>
    el("span", { class: "shot", "data-label": label, title: `shot ${k + 1}: ${view.labels[label]}`,
      style: { background: classColour(label) } })));
  const blocks = Object.entries(detail.records).map(([model, record]) => {
    const scores = record.label_scores || [];
    const best = Math.max(...scores), worst = Math.min(...scores);
    return el("div", { class: "model-block", "data-model": model },
      el("h3", {}, `${model}: gold ${record.gold_label}, predicted ${record.predicted_label ?? "—"}`, " ", mark(record.correct ?? null)),
      scores.length ? el("table", { class: "result" }, el("tbody", {}, scores.map((score, i) => el("tr", {},
        el("th", { style: { color: classColour(i) } }, view.labels[i], i === record.gold ? " (gold)" : ""),
        el("td", {}, score.toFixed(2)),
        el("td", { style: { textAlign: "left" } }, el("span", { class: "bar", style: {
          width: `${best === worst ? 100 : 4 + 120 * (score - worst) / (best - worst)}px`,
          background: i === record.prediction ? "var(--accent)" : "#c3cad6" } })))))) : el("p", { class: "hint" }, record.status));
  });
  return [el("h3", {}, `Demonstration order: ${view.sequence.length} shots (${detail.records[Object.keys(detail.records)[0]].order})`),
    sequence, legend, el("h3", {}, "Test query"), el("p", { class: "output" }, view.query), ...blocks];
}

function hallucinationView(detail, id, expandAll) {
  const view = detail.view;
  const parts = [];
  if (view) {
    if (view.question) parts.push(el("h3", {}, "Question"), el("p", {}, view.question));
    const doc = view.document;
    const body = el("div", { class: "document" }, elided(doc, id, expandAll, `… ${doc.elided} characters …`, "text"));
    parts.push(el("h3", {}, `Document (${doc.chars} characters)`), body);
  }
  const first = Object.values(detail.records)[0];
  parts.push(el("h3", {}, "Reference"), el("p", {}, first.reference || ""));
  for (const [model, record] of Object.entries(detail.records)) {
    parts.push(el("div", { class: "model-block", "data-model": model },
      el("h3", {}, `${model}: `, record.verdict === true ? el("span", { class: "ok" }, "hallucination-free")
        : record.verdict === false ? el("span", { class: "bad" }, "hallucinated") : el("span", { class: "hint" }, "verdict unparsed")),
      el("p", { class: "output" }, record.output),
      el("dl", { class: "fields" }, el("dt", {}, "judge"), el("dd", {}, record.judge),
        el("dt", {}, "rationale"), el("dd", {}, record.judge_rationale || "—"),
        el("dt", {}, "document tokens cut"), el("dd", {}, fmt(record.truncated_tokens)))));
  }
  return parts;
}

const VIEWS = { needle: needleView, attention: attentionView, icl: iclView, hallucination: hallucinationView };

start();
